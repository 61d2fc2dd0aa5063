"""``memlane eval golden --file cases.yaml``: recall@k of a real sidecar on a team's own golden set, for CI.

The file (YAML; ``examples/golden/cases.yaml`` is a worked example)::

    k: 5               # recall cutoff (default 5; --k overrides)
    threshold: 0.8     # exit status 1 when recall@k is under this (default 0; --threshold overrides)
    cases:
      - name: moved-city           # unique; each case is its own user, so cases never see each other
        sessions:                  # replayed in order; each is closed and promoted like a real session
          - - {role: user, content: "I live in Bangalore."}
            - {role: assistant, content: "Noted!"}
          - - {role: user, content: "I moved to Pune last month.", name: Priya}
        questions:
          - ask: Where does the user live?
            expect: [Pune]         # the expected memories: texts some recalled memory must contain
                                   # (case-insensitive); recall@k counts those found in the first k

``turns:`` may stand for a single session. Roles are ``user``, ``assistant``, ``system``, ``tool``;
``name`` is the speaker (participant name). The harness drives the sidecar only through the public
client, as an agent would: AppendMessages, PromoteSession (close), SearchMemories.
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

import memlane
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import session_pb2 as spb

from ..background import SidecarThread
from ..keyspace import drop_keys
from ..ltm.recall import text_key
from .locomo import eval_settings

AGENT = "golden-eval"
_ROLES = {
    "user": spb.ROLE_USER,
    "assistant": spb.ROLE_ASSISTANT,
    "system": spb.ROLE_SYSTEM,
    "tool": spb.ROLE_TOOL,
}


class GoldenFileError(ValueError):
    """The file does not follow the documented format; the message says where."""


@dataclass(frozen=True, slots=True)
class Question:
    ask: str
    expect: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    sessions: tuple[tuple[spb.Message, ...], ...]
    questions: tuple[Question, ...]


@dataclass(frozen=True, slots=True)
class GoldenSet:
    cases: tuple[Case, ...]
    k: int = 5
    threshold: float = 0.0


@dataclass(slots=True)
class Outcome:
    case: str
    ask: str
    expected: int
    found_at_k: int
    found_at_1: int
    missing: list[str] = field(default_factory=list)
    repeats: int = 0  # memories (by id or by text) the question's assembled context carries twice


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise GoldenFileError(f"{where}: {what}")


def _message(raw: Any, where: str) -> spb.Message:
    _need(isinstance(raw, dict), where, "a turn is a mapping with role and content")
    role = _ROLES.get(str(raw.get("role", "")).lower())
    if role is None:
        raise GoldenFileError(f"{where}: role must be one of {', '.join(_ROLES)}")
    content = raw.get("content")
    _need(isinstance(content, str) and bool(content.strip()), where, "content must be non-empty text")
    return spb.Message(role=role, content=content, participant_name=str(raw.get("name", "")))


def _case(raw: Any, index: int) -> Case:
    where = f"cases[{index}]"
    _need(isinstance(raw, dict), where, "a case is a mapping")
    name = str(raw.get("name") or f"case-{index + 1}")
    sessions_raw = raw.get("sessions") if "sessions" in raw else [raw.get("turns")]
    _need(isinstance(sessions_raw, list) and bool(sessions_raw), where, "needs sessions (or turns)")
    sessions = []
    for s, turns in enumerate(sessions_raw):
        _need(isinstance(turns, list) and bool(turns), f"{where}.sessions[{s}]", "a non-empty list of turns")
        sessions.append(tuple(_message(t, f"{where}.sessions[{s}][{i}]") for i, t in enumerate(turns)))
    questions = []
    for q, item in enumerate(raw.get("questions") or []):
        qwhere = f"{where}.questions[{q}]"
        _need(isinstance(item, dict) and isinstance(item.get("ask"), str), qwhere, "needs ask (text)")
        expect = item.get("expect")
        expect = [expect] if isinstance(expect, str) else expect
        _need(isinstance(expect, list) and bool(expect), qwhere, "needs expect (a list of texts)")
        questions.append(Question(item["ask"], tuple(str(e) for e in expect)))
    _need(bool(questions), where, "needs at least one question")
    return Case(name, tuple(sessions), tuple(questions))


def load(path: str | Path) -> GoldenSet:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise GoldenFileError(f"{path}: {exc}") from exc
    _need(isinstance(data, dict) and isinstance(data.get("cases"), list), str(path), "expected a cases list")
    cases = tuple(_case(c, i) for i, c in enumerate(data["cases"]))
    names = [c.name for c in cases]
    _need(len(set(names)) == len(names), str(path), "case names must be unique")
    k, threshold = data.get("k", 5), data.get("threshold", 0.0)
    _need(isinstance(k, int) and 1 <= k <= 100, str(path), "k must be an integer from 1 to 100")
    _need(isinstance(threshold, int | float) and 0 <= threshold <= 1, str(path), "threshold in [0, 1]")
    return GoldenSet(cases, k, float(threshold))


def _replay(client: memlane.Client, user_id: str, case: Case) -> None:
    for n, turns in enumerate(case.sessions, start=1):
        session_id = f"{user_id}-s{n}"
        client.create_session(session_id=session_id, user_id=user_id, agent_id=AGENT)
        client.append_messages(session_id=session_id, messages=list(turns))
        client.promote_session(session_id=session_id, close=True, timeout=600)


def _ask(client: memlane.Client, user_id: str, case: Case, k: int) -> list[Outcome]:
    who = mpb.Caller(user_id=user_id, agent_id=AGENT)
    asking = f"{user_id}-ask"
    client.create_session(session_id=asking, user_id=user_id, agent_id=AGENT)
    out = []
    for q in case.questions:
        hits = client.search_memories(caller=who, query=q.ask, limit=k).results
        texts = [h.memory.content.lower() for h in hits]
        found = [e for e in q.expect if any(e.lower() in t for t in texts)]
        first = [e for e in q.expect if texts and e.lower() in texts[0]]
        missing = [e for e in q.expect if e not in found]
        repeats = context_repeats(client.assemble_context(session_id=asking, user_input=q.ask))
        out.append(Outcome(case.name, q.ask, len(q.expect), len(found), len(first), missing, repeats))
    return out


def context_repeats(parts: Iterable[cpb.AssembleContextResponse]) -> int:
    """Memories an assembled context injects twice: the same id in two places, or the same line."""
    ids: list[str] = []
    lines: list[str] = []
    for part in parts:
        for block in part.blocks:
            if block.provenance not in (cpb.PROVENANCE_PROFILE, cpb.PROVENANCE_MEMORY):
                continue
            ids += [m.memory_id for m in block.memories]
            lines += [ln for m in block.messages for ln in m.content.splitlines() if ln.startswith("- ")]
    return (len(ids) - len(set(ids))) + (len(lines) - len({text_key(ln) for ln in lines}))


def recall(outcomes: list[Outcome], at_one: bool = False) -> float:
    """Expected memories found, over all expected memories (each counts once)."""
    total = sum(o.expected for o in outcomes)
    found = sum(o.found_at_1 if at_one else o.found_at_k for o in outcomes)
    return found / total if total else 0.0


def run(
    path: str | Path,
    *,
    k: int | None = None,
    threshold: float | None = None,
    redis_url: str = "",
    out: TextIO | None = None,
) -> int:
    """Runs the set, prints the figures and every miss; returns the exit status (1 under threshold)."""
    golden = load(path)
    k = k or golden.k
    threshold = golden.threshold if threshold is None else threshold
    outcomes: list[Outcome] = []
    key_prefix = f"golden{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="memlane-golden-") as workdir:
        settings = eval_settings(Path(workdir), redis_url, key_prefix)
        try:
            with SidecarThread(settings) as sidecar, memlane.Client(sidecar.target, timeout=60) as client:
                run_id = uuid.uuid4().hex[:6]
                for index, case in enumerate(golden.cases):
                    user_id = f"golden-{run_id}-{index}"
                    _replay(client, user_id, case)
                    outcomes += _ask(client, user_id, case, k)
        finally:
            if redis_url:
                drop_keys(redis_url, key_prefix)
    at_k, at_1 = recall(outcomes), recall(outcomes, at_one=True)
    w = (out or sys.stdout).write
    w(f"golden set: {path}: {len(golden.cases)} cases, {len(outcomes)} questions\n")
    for o in outcomes:
        if o.missing:
            w(f"  miss  {o.case}: {o.ask!r}: not in the first {k}: {', '.join(map(repr, o.missing))}\n")
    w(f"recall@1 {at_1:.3f}  recall@{k} {at_k:.3f}  (threshold {threshold:.3f})\n")
    w(f"memories injected twice in the questions' contexts: {sum(o.repeats for o in outcomes)}\n")
    if at_k < threshold:
        w(f"FAIL: recall@{k} {at_k:.3f} is under the threshold {threshold:.3f}\n")
        return 1
    return 0
