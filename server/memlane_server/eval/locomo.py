"""``memlane eval locomo``: evidence recall of a real sidecar on a LoCoMo-format file, with baselines.

The sidecar is the real one (``SidecarThread``: real Redis, LanceDB in a temporary directory, the
real ONNX model) and is driven only through the public client, as an agent would drive it:

1. each conversation is one user; each of its sessions is a memlane session whose turns are appended
   in order (the session date as message time, the speaker as participant, the dia_id as message id,
   an image caption as ``[shares <caption>]``);
2. each session is closed and promoted by the normal session-end pipeline (PromoteSession);
3. each question is asked with SearchMemories for that user; results are scored in rank order by the
   turns their provenance (``source_message_ids``) names.

Two baselines run in the same process over the raw turns: BM25 and vector-only cosine with the same
embedding model as the sidecar.

The BM25 baseline (``BM25``, below) is Okapi BM25 over a fixed list of documents, plain and self-contained
on purpose (lower-cased word tokens, English stop words removed, k1=1.2, b=0.75), so the baseline means the
same thing in every run and owes nothing to the product's index.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import orjson
from tqdm import tqdm

import memlane
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import session_pb2 as spb

from ..background import SidecarThread
from ..config import ENV_PREFIX, Settings, build_settings
from ..embedding import OnnxEmbedder
from ..keyspace import drop_keys
from ..tokens import TokenCounter
from ..wiring.embedding import embedding_spec
from .comparisons import LeaveOneOut, MemoryOffComparison
from .comparisons import evaluate as leave_one_out_eval
from .evidence import (
    BUDGETS,
    CATEGORIES,
    CUTOFFS,
    SCORED,
    Conversation,
    Retrieved,
    Scores,
    load,
    percentile,
    repeats_within,
    turn_messages,
)

AGENT = "eval-agent"
# Enough results to fill the largest token budget with turn-sized items; the API allows up to 100.
SEARCH_LIMIT = 50
APPEND_BATCH = 100
REPEAT_BUDGET = 512  # the budget the figures are read at
_DONE = (spb.PROMOTION_STATE_PROMOTED, spb.PROMOTION_STATE_ARCHIVED)


@dataclass(slots=True)
class SystemResult:
    name: str
    by_category: dict[int, Scores] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)
    repeats: int = 0  # results within REPEAT_BUDGET tokens that repeat an earlier result's text
    repeat_tokens: int = 0

    def add(self, category: int, results: list[Retrieved], evidence: frozenset[str]) -> None:
        self.by_category.setdefault(category, Scores()).add(results, evidence)
        count, tokens = repeats_within(results, REPEAT_BUDGET)
        self.repeats += count
        self.repeat_tokens += tokens

    def scored(self) -> Scores:
        total = Scores()
        for c in SCORED:
            if c in self.by_category:
                total.merge(self.by_category[c])
        return total

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "overall_1_4": self.scored().summary(),
            "categories": {f"{c}-{CATEGORIES[c]}": s.summary() for c, s in sorted(self.by_category.items())},
        }
        out["repeats_within_512tok"] = {"results": self.repeats, "tokens": self.repeat_tokens}
        if self.latencies_ms:
            out["latency_ms"] = {
                "p50": percentile(self.latencies_ms, 50),
                "p99": percentile(self.latencies_ms, 99),
            }
        return out


@dataclass(slots=True)
class Report:
    data: str
    conversations: int
    turns: int
    questions: int
    ingest_s: float
    systems: list[SystemResult]
    memory_off: MemoryOffComparison | None = None  # --compare memory-off
    leave_one_out: LeaveOneOut | None = None  # --leave-one-out
    embedded: list[dict[str, int]] = field(default_factory=list)  # per conversation: items by kind

    def to_json(self) -> dict[str, Any]:
        return {
            "data": self.data,
            "conversations": self.conversations,
            "turns": self.turns,
            "questions": self.questions,
            "ingest_seconds": self.ingest_s,
            "systems": {s.name: s.to_json() for s in self.systems},
            **({"context_ab": self.memory_off.to_json()} if self.memory_off else {}),
            **({"leave_one_out": self.leave_one_out.to_json()} if self.leave_one_out else {}),
            "stored_per_conversation": self.embedded,
            "stored_per_100_turns": self.stored_per_100_turns,
        }

    @property
    def stored_per_100_turns(self) -> float:
        """Memories stored (retired ones included) per 100 turns replayed: recall must not be bought
        with noise."""
        return 100.0 * sum(sum(e.values()) for e in self.embedded) / max(1, self.turns)

    def print(self, out: TextIO = sys.stdout) -> None:
        w = out.write
        w(f"data: {self.data}\n")
        w(
            f"{self.conversations} conversations, {self.turns} turns, {self.questions} questions;"
            f" memlane ingest (replay + close + promote) {self.ingest_s:.1f} s"
            f" ({self.turns / max(self.ingest_s, 1e-9):.0f} turns/s)\n"
        )
        if self.embedded:
            # Each stored item is one embedded text: what ingest paid the model for.
            per = "; ".join(", ".join(f"{k} {v}" for k, v in sorted(e.items())) for e in self.embedded)
            w(f"memories stored (each one embedded text), per conversation: {per}\n")
            w(f"memories stored per 100 turns: {self.stored_per_100_turns:.1f}\n")
        head = [f"@{b}tok" for b in BUDGETS] + [f"R@{k}" for k in CUTOFFS] + ["MRR", "n"]
        w(f"{'system':<10}{'category':<18}" + "".join(f"{h:>9}" for h in head) + "\n")
        for system in self.systems:
            rows: list[tuple[str, Scores]] = [
                (f"{c} {CATEGORIES[c]}", system.by_category[c]) for c in SCORED if c in system.by_category
            ]
            rows.append(("overall 1-4", system.scored()))
            if 5 in system.by_category:
                rows.append((f"(5 {CATEGORIES[5]})", system.by_category[5]))
            for label, scores in rows:
                s = scores.summary()
                cells = [s[f"recall@{b}tok"] for b in BUDGETS] + [s[f"R@{k}"] for k in CUTOFFS] + [s["MRR"]]
                w(
                    f"{system.name:<10}{label:<18}"
                    + "".join(f"{v:>9.3f}" for v in cells)
                    + f"{int(s['n']):>9}\n"
                )
            w(
                f"{system.name:<10}{'repeats':<18} {system.repeats} results within {REPEAT_BUDGET} tokens"
                f" repeat an earlier one's text ({system.repeat_tokens} tokens)\n"
            )
            if system.latencies_ms:
                p50, p99 = percentile(system.latencies_ms, 50), percentile(system.latencies_ms, 99)
                w(
                    f"{system.name:<10}{'question latency':<18} p50 {p50:.1f} ms  p99 {p99:.1f} ms"
                    " (SearchMemories through the client)\n"
                )


# ------------------------------------------------------------------------------------ memlane


def _replay(client: memlane.Client, user_id: str, conv: Conversation) -> None:
    """Each session appended in order, then closed and promoted by the session-end pipeline."""
    for session in conv.sessions:
        session_id = f"{user_id}-s{session.number}"
        client.create_session(
            session_id=session_id, user_id=user_id, agent_id=AGENT, participants=list(conv.speakers)
        )
        messages = turn_messages(session.turns)
        for start in range(0, len(messages), APPEND_BATCH):
            client.append_messages(session_id=session_id, messages=messages[start : start + APPEND_BATCH])
        state = client.promote_session(session_id=session_id, close=True, timeout=600).session.promotion_state
        while state not in _DONE:  # another pipeline run holds the session: wait for it to finish
            time.sleep(0.05)
            state = client.get_session(session_id=session_id).session.promotion_state


def _stored(client: memlane.Client, user_id: str) -> dict[str, int]:
    """The user's items by kind (retired ones included: each was embedded once)."""
    counts: dict[str, int] = {}
    who, token = mpb.Caller(user_id=user_id, agent_id=AGENT), ""
    while True:
        page = client.list_memories(
            caller=who, filter=mpb.MemoryFilter(include_retired=True), page_size=500, page_token=token
        )
        for m in page.memories:
            name = mpb.MemoryKind.Name(m.kind).removeprefix("MEMORY_KIND_").lower()
            counts[name] = counts.get(name, 0) + 1
        token = page.next_page_token
        if not token:
            return counts


def _ask(
    client: memlane.Client, user_id: str, conv: Conversation, tokens: TokenCounter, result: SystemResult
) -> None:
    who = mpb.Caller(user_id=user_id, agent_id=AGENT)
    for q in conv.questions:
        t = time.perf_counter()
        hits = client.search_memories(caller=who, query=q.text, limit=SEARCH_LIMIT).results
        result.latencies_ms.append((time.perf_counter() - t) * 1000)
        retrieved = [
            Retrieved(h.memory.content, tuple(h.memory.source_message_ids), tokens.count(h.memory.content))
            for h in hits
        ]
        result.add(q.category, retrieved, q.evidence)


def eval_settings(workdir: Path, redis_url: str, key_prefix: str) -> Settings:
    return build_settings(
        flags={
            "listen": "127.0.0.1:0",
            "admin_listen": "",
            "redis_url": redis_url,  # empty: the sidecar starts an embedded Redis in its data dir
            "key_prefix": key_prefix,
            "data_dir": str(workdir),
            "log_level": "WARNING",
            # Each session is promoted whole at its end (as documented above), not learnt from meanwhile:
            # the figures do not depend on how the replay's appends interleave with the learner.
            "learn_every_turns": 0,
            "learn_idle_seconds": 0,
        },
        # The model under evaluation may be chosen as the sidecar's is (MEMLANE_EMBEDDING_MATHS=as-shipped
        # compares the model's own fp32 maths with the default int8); nothing else of the environment.
        env={k: v for k, v in os.environ.items() if k.startswith(f"{ENV_PREFIX}EMBEDDING_")},
    )


# ------------------------------------------------------------------------------------ baselines


def _baselines(
    conversations: list[Conversation], settings: Settings, tokens: TokenCounter
) -> tuple[SystemResult, SystemResult]:
    bm25_result, vector_result = SystemResult("bm25"), SystemResult("vector")
    embedder = OnnxEmbedder.load(
        embedding_spec(settings.embedding), bulk_threads=settings.embedding.embedding_threads
    )
    try:
        for conv in conversations:
            turns = conv.turns
            docs = [t.baseline_text() for t in turns]
            items = [Retrieved(d, (t.dia_id,), tokens.count(d)) for d, t in zip(docs, turns, strict=True)]
            bm25 = BM25(docs)
            doc_vectors = asyncio.run(embedder.embed(docs))
            query_vectors = asyncio.run(embedder.embed([q.text for q in conv.questions]))
            for q, qv in zip(conv.questions, query_vectors, strict=True):
                bm25_result.add(q.category, [items[i] for i in bm25.top(q.text, SEARCH_LIMIT)], q.evidence)
                order = np.argsort(-(doc_vectors @ qv), kind="stable")[:SEARCH_LIMIT]
                vector_result.add(q.category, [items[int(i)] for i in order], q.evidence)
    finally:
        asyncio.run(embedder.close())
    return bm25_result, vector_result


def _leave_one_out(
    settings: Settings,
    workdir: Path,
    users: list[str],
    conversations: list[Conversation],
    tokens: TokenCounter,
) -> LeaveOneOut:
    """Over the table the (stopped) sidecar wrote in ``workdir``."""
    table = Path(settings.ltm.ltm_uri) if settings.ltm.ltm_uri else workdir / "ltm"
    embedder = OnnxEmbedder.load(
        embedding_spec(settings.embedding), bulk_threads=settings.embedding.embedding_threads
    )
    try:
        return leave_one_out_eval(
            table,
            embedder,
            users=users,
            agent=AGENT,
            conversations=conversations,
            tokens=tokens,
            limit=SEARCH_LIMIT,
        )
    finally:
        asyncio.run(embedder.close())


# ------------------------------------------------------------------------------------ entry point


def run(
    data: str | Path,
    *,
    json_out: str | Path | None = None,
    redis_url: str = "",
    out: TextIO = sys.stdout,
    key_prefix: str = "",
    compare: str = "",
    leave_one_out: bool = False,
) -> Report:
    """``key_prefix``: of every Redis key the run creates (default: a fresh ``eval<hex>``); on a given
    ``redis_url`` those keys are deleted at the end, whatever happens. ``compare="memory-off"``: also the
    context A/B of ``comparisons.py``, printed after the table. ``leave_one_out``: also the
    leave-one-conversation-out evaluation of ``comparisons.py`` over the same ingest."""
    comparison = MemoryOffComparison() if compare == "memory-off" else None
    conversations = load(data)
    tokens = TokenCounter()
    memlane_result = SystemResult("memlane")
    key_prefix = key_prefix or f"eval{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="memlane-eval-") as workdir:
        settings = eval_settings(Path(workdir), redis_url, key_prefix)
        ingest_s = 0.0
        users: list[str] = []
        embedded: list[dict[str, int]] = []
        try:
            with SidecarThread(settings) as sidecar, memlane.Client(sidecar.target, timeout=60) as client:
                run_id = uuid.uuid4().hex[:6]
                # A bar on a terminal only (disable=None): logs and CI output stay clean.
                for index, conv in enumerate(
                    tqdm(conversations, desc="ingest and ask", unit="conv", disable=None)
                ):
                    user_id = f"eval-{run_id}-{index}"
                    users.append(user_id)
                    t = time.perf_counter()
                    _replay(client, user_id, conv)
                    ingest_s += time.perf_counter() - t
                    embedded.append(_stored(client, user_id))
                    _ask(client, user_id, conv, tokens, memlane_result)
                    if comparison is not None:
                        comparison.ask(client, user_id, AGENT, conv)
        finally:
            if redis_url:
                drop_keys(redis_url, key_prefix)
        bm25_result, vector_result = _baselines(conversations, settings, tokens)
        loo = _leave_one_out(settings, Path(workdir), users, conversations, tokens) if leave_one_out else None
    report = Report(
        data=str(data),
        conversations=len(conversations),
        turns=sum(len(c.turns) for c in conversations),
        questions=sum(len(c.questions) for c in conversations),
        ingest_s=ingest_s,
        systems=[memlane_result, bm25_result, vector_result],
        memory_off=comparison,
        leave_one_out=loo,
        embedded=embedded,
    )
    report.print(out)
    if comparison is not None:
        comparison.print(out)
    if loo is not None:
        loo.print(out)
    if json_out:
        Path(json_out).write_bytes(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2))
    return report


# The BM25 baseline: plain and self-contained on purpose (see the module's docstring).

_WORD = re.compile(r"[a-z0-9]+")
STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has
    have having he her here hers herself him himself his how i if in into is it its itself just me
    more most my myself no nor not now of off on once only or other our ours ourselves out over own
    same she should so some such than that the their theirs them themselves then there these they
    this those through to too under until up very was we were what when where which while who whom
    why will with would you your yours yourself yourselves s t""".split()  # noqa: SIM905 - a word list reads best as words
)


def tokenize(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


class BM25:
    def __init__(self, documents: list[str], *, k1: float = 1.2, b: float = 0.75) -> None:
        self._k1, self._b = k1, b
        self._docs = [Counter(tokenize(d)) for d in documents]
        self._lengths = [sum(c.values()) for c in self._docs]
        self._avg = (sum(self._lengths) / len(self._lengths)) if self._lengths else 0.0
        df: Counter[str] = Counter()
        for c in self._docs:
            df.update(c.keys())
        n = len(self._docs)
        self._idf = {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> list[float]:
        terms = [t for t in dict.fromkeys(tokenize(query)) if t in self._idf]
        out: list[float] = []
        for doc, length in zip(self._docs, self._lengths, strict=True):
            score = 0.0
            norm = self._k1 * (1.0 - self._b + self._b * length / self._avg) if self._avg else self._k1
            for t in terms:
                tf = doc.get(t, 0)
                if tf:
                    score += self._idf[t] * tf * (self._k1 + 1.0) / (tf + norm)
            out.append(score)
        return out

    def top(self, query: str, k: int) -> list[int]:
        """Indexes of the ``k`` best documents, best first (documents scoring 0 are left out)."""
        scored = [(s, i) for i, s in enumerate(self.scores(query)) if s > 0.0]
        scored.sort(key=lambda p: (-p[0], p[1]))
        return [i for _, i in scored[:k]]
