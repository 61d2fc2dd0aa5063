"""The evidence an evaluation scores against: the LoCoMo file (conversations of dated sessions, and
questions with evidence turn ids), and scoring retrieved results against a question's evidence turns.

**The file.** Only the harness reads this format; the product never sees it (the harness replays the
turns through the public API like any client would).

**Scoring.** A result is what a retriever returned: its text (what an agent would read, so what the
token budget pays for) and the turn ids it covers (its provenance). Recall within a budget takes results
in rank order while their texts fit in the budget: the budget makes item size irrelevant, so a
retriever cannot win by returning bigger items.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from memlane.v1 import session_pb2 as spb

from ..ltm.recall import text_key

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
SCORED = (1, 2, 3, 4)
_SESSION_KEY = re.compile(r"^session_(\d+)$")
# "D:11:26" -> "D11:26", "D30:05" -> "D30:5"; anything else that names no turn is dropped.
_EVIDENCE = re.compile(r"^D:?(\d+):0*(\d+)$")
_MERIDIEM = re.compile(r"\b[ap]m\b", re.I)
_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%d %B, %Y", "%d %B %Y")


@dataclass(frozen=True, slots=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    caption: str
    at_ms: int
    date_text: str

    def spoken(self) -> str:
        """What the speaker said, with a shared image as ``[shares <caption>]``."""
        return f"{self.text} [shares {self.caption}]" if self.caption else self.text

    def baseline_text(self) -> str:
        """The raw-turn document of the baselines: ``(<session date>) <speaker>: <text> [shares ...]``."""
        return f"({self.date_text}) {self.speaker}: {self.spoken()}"


@dataclass(frozen=True, slots=True)
class Session:
    number: int
    at_ms: int
    turns: list[Turn]


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    category: int
    evidence: frozenset[str]
    answer: str


@dataclass(slots=True)
class Conversation:
    sample_id: str
    speakers: tuple[str, str]
    sessions: list[Session] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s.turns]


def parse_date(text: str) -> dt.datetime:
    cleaned = " ".join(_MERIDIEM.sub(lambda m: m.group(0).upper(), text).split())
    for fmt in _DATE_FORMATS:
        try:
            return dt.datetime.strptime(cleaned, fmt).replace(tzinfo=dt.UTC)
        except ValueError:
            continue
    raise ValueError(f"unreadable session date {text!r}")


def clean_evidence(raw: list[Any], known: set[str]) -> frozenset[str]:
    """Split on ';' and spaces, normalise ``D:11:26``/``D30:05``, drop bare ``D`` and unknown ids."""
    out: set[str] = set()
    for entry in raw:
        for part in re.split(r"[;\s]+", str(entry)):
            m = _EVIDENCE.match(part.strip())
            if m:
                dia_id = f"D{int(m.group(1))}:{int(m.group(2))}"
                if dia_id in known:
                    out.add(dia_id)
    return frozenset(out)


def _conversation(sample: dict[str, Any]) -> Conversation:
    conv = sample["conversation"]
    speakers = (str(conv.get("speaker_a", "")), str(conv.get("speaker_b", "")))
    sessions: list[Session] = []
    for key, turns in conv.items():
        m = _SESSION_KEY.match(key)
        if not m or not isinstance(turns, list) or not turns:
            continue
        number = int(m.group(1))
        date_text = str(conv.get(f"{key}_date_time", ""))
        at_ms = int(parse_date(date_text).timestamp() * 1000)
        sessions.append(
            Session(
                number,
                at_ms,
                [
                    Turn(
                        dia_id=str(t["dia_id"]),
                        speaker=str(t["speaker"]),
                        text=str(t.get("text", "")),
                        caption=str(t.get("blip_caption") or ""),
                        at_ms=at_ms,
                        date_text=date_text,
                    )
                    for t in turns
                ],
            )
        )
    sessions.sort(key=lambda s: s.number)
    out = Conversation(str(sample.get("sample_id", "")), speakers, sessions)
    known = {t.dia_id for t in out.turns}
    for qa in sample.get("qa", []):
        evidence = clean_evidence(list(qa.get("evidence") or []), known)
        if not evidence:
            continue  # nothing to score against
        answer = qa.get("answer", qa.get("adversarial_answer", ""))
        out.questions.append(Question(str(qa["question"]), int(qa["category"]), evidence, str(answer)))
    return out


def load(path: str | Path) -> list[Conversation]:
    samples = orjson.loads(Path(path).read_bytes())
    if not isinstance(samples, list):
        raise ValueError(f"{path}: expected a list of conversations")
    return [_conversation(s) for s in samples]


def turn_messages(turns: Sequence[Turn]) -> list[spb.Message]:
    """A LoCoMo session's turns as messages. Both speakers are people talking to each other: each is a
    user of the session, told apart by participant name."""
    return [
        spb.Message(
            message_id=t.dia_id,
            role=spb.ROLE_USER,
            participant_name=t.speaker,
            content=t.spoken(),
            created_at_unix_ms=t.at_ms,
        )
        for t in turns
    ]


# Scoring: retrieved results against a question's evidence turns.

BUDGETS = (256, 512, 1024)
CUTOFFS = (5, 10)


@dataclass(frozen=True, slots=True)
class Retrieved:
    text: str
    turn_ids: tuple[str, ...]
    tokens: int


@dataclass(slots=True)
class Scores:
    """Per-question scores; ``add`` accumulates them for a category or a whole run."""

    within: dict[int, list[float]] = field(default_factory=lambda: {b: [] for b in BUDGETS})
    at: dict[int, list[float]] = field(default_factory=lambda: {k: [] for k in CUTOFFS})
    reciprocal_ranks: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.reciprocal_ranks)

    def add(self, results: Sequence[Retrieved], evidence: frozenset[str]) -> None:
        for budget in BUDGETS:
            covered: set[str] = set()
            used = 0
            for r in results:
                if used + r.tokens > budget:
                    break
                used += r.tokens
                covered.update(r.turn_ids)
            self.within[budget].append(len(covered & evidence) / len(evidence))
        for k in CUTOFFS:
            top = {t for r in results[:k] for t in r.turn_ids}
            self.at[k].append(len(top & evidence) / len(evidence))
        rank = next((i for i, r in enumerate(results, 1) if evidence.intersection(r.turn_ids)), 0)
        self.reciprocal_ranks.append(1.0 / rank if rank else 0.0)

    def merge(self, other: Scores) -> None:
        for b in BUDGETS:
            self.within[b] += other.within[b]
        for k in CUTOFFS:
            self.at[k] += other.at[k]
        self.reciprocal_ranks += other.reciprocal_ranks

    def summary(self) -> dict[str, float]:
        mean: Callable[[list[float]], float] = lambda xs: statistics.fmean(xs) if xs else 0.0  # noqa: E731
        out = {f"recall@{b}tok": mean(self.within[b]) for b in BUDGETS}
        out.update({f"R@{k}": mean(self.at[k]) for k in CUTOFFS})
        out["MRR"] = mean(self.reciprocal_ranks)
        out["n"] = float(self.n)
        return out


def repeats_within(results: Sequence[Retrieved], budget: int) -> tuple[int, int]:
    """How many of the results a reader gets within ``budget`` repeat an earlier one's text (case and
    spacing aside), and the tokens they cost: context spent on saying one thing twice."""
    seen: set[str] = set()
    used = count = tokens = 0
    for r in results:
        if used + r.tokens > budget:
            break
        used += r.tokens
        key = text_key(r.text)
        if key in seen:
            count += 1
            tokens += r.tokens
        seen.add(key)
    return count, tokens


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[index]
