"""Summaries in assembly, in one room: the part a viewer is shown, the gap folded in for a request, the
summary a client submits, and the background run that keeps the stored one current.

Parts are stored per visibility scope (``summarizers.summarizer``); which of them a viewer gets is decided
by ``Caller.can_see``, the one access rule, on the scope's visibility, source agent and group, exactly as
for the turns themselves. Composing is cheap (no summarizer call), so it happens on every request. The
other three write a summary: each folds per scope like any summary and stores by compare-and-set, so
whichever writer loses a race simply leaves the winner's summary in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import replace

from ..access.identity import Caller
from ..errors import Conflict, InvalidArgument, MemlaneError, ResourceExhausted
from ..sessions.ending import REASON_SUMMARIZE, SessionEndQueue
from ..sessions.model import ScopedSummary, Session, Summary, VisibilityKind
from ..sessions.store import SessionStore
from ..summarizers import ExtractiveSummarizer, Summarizer
from ..summarizers.summarizer import SESSION_SCOPE, Scope, fold_scoped, scope_of
from ..tokens import TokenCounter
from .model import GapFold, SummaryRange
from .traces import now_ms

# A part's label ("In group ops, from agent planner:") in tokens, roughly; only decides whether to count.
_LABEL_TOKENS = 12


def can_read(viewer: Caller, scope: Scope) -> bool:
    return scope.visibility == VisibilityKind.SESSION or viewer.can_see(
        scope.visibility, scope.agent_id, scope.group
    )


def _label(part: ScopedSummary) -> str:
    if part.visibility == VisibilityKind.AGENT:
        return f"Private to agent {part.agent_id}:"
    return f"In group {part.group}, from agent {part.agent_id}:"


def _cut(text: str, tokens: int, counter: TokenCounter, model: str) -> str:
    """At most ``tokens`` of ``text``, ending at a line end when it was cut (no half items)."""
    cut = counter.truncate(text, max(0, tokens), model)
    if cut != text and "\n" in cut:
        cut = cut[: cut.rfind("\n")]
    return cut


def _fair_shares(costs: list[int], cap: int) -> list[int]:
    shares = [0] * len(costs)
    left, pending = cap, len(costs)
    for i in sorted(range(len(costs)), key=lambda i: costs[i]):
        shares[i] = min(costs[i], left // pending)
        left -= shares[i]
        pending -= 1
    return shares


def viewer_summary(
    summary: Summary, viewer: Caller, counter: TokenCounter, model: str, cap_tokens: int
) -> tuple[Summary, bool]:
    """``summary`` as ``viewer`` may read it: one text, the scoped parts labelled after the shared one,
    and whether parts were cut to ``cap_tokens``.

    With several parts over ``cap_tokens`` the cap is shared max-min fairly (a part smaller than an equal
    share keeps all of it, the rest is split among the larger ones), so a long shared part never pushes a
    viewer's private part out (a single part is left to the block's fit, as before scopes existed).
    """
    scoped = [
        p for p in summary.scoped if can_read(viewer, Scope(p.visibility, p.agent_id, p.group)) and p.text
    ]
    if not scoped:
        return replace(summary, scoped=[]), False
    parts = ([f"Shared:\n{summary.text}"] if summary.text else []) + [
        f"{_label(p)}\n{p.text}" for p in scoped
    ]
    # The stored counts (plus a label's worth) decide whether to cut: no tokenizing on the hot path
    # unless something must go.
    costs = ([summary.token_count + _LABEL_TOKENS] if summary.text else []) + [
        p.token_count + _LABEL_TOKENS for p in scoped
    ]
    cut = False
    if cap_tokens > 0 and sum(costs) > cap_tokens:
        costs = counter.count_many(parts, model)
        if cut := sum(costs) > cap_tokens:
            shares = _fair_shares(costs, cap_tokens)
            parts = [_cut(part, share, counter, model) for part, share in zip(parts, shares, strict=True)]
            parts = [p for p in parts if "\n" in p]  # a part cut down to its label is left out
            costs = counter.count_many(parts, model)
    # token_count: the parts' counts (joins aside); assembly costs the block itself.
    return replace(summary, text="\n\n".join(parts), token_count=sum(costs), scoped=[]), cut


# --- The gap summary, folded for one request ----------------------------------------------------------
# The gap summary: when the stored summary is behind, the turns it lacks are folded in for this
# request with the fast extractive summarizer (off the loop), per scope like any summary.
#
# A session without any summary (a resumption) stores the fold of every scope, so the next request starts
# from it; losing that race to another writer (the background run, a client) is fine.


async def fold_gap(
    summarizer: ExtractiveSummarizer, store: SessionStore, session: Session, viewer: Caller, gap: GapFold
) -> tuple[Summary, bool]:
    """The folded summary, and whether it is now the session's stored one."""

    def readable(scope: Scope) -> bool:
        return can_read(viewer, scope)

    folded = await fold_scoped(
        summarizer, gap.previous, gap.leaving, gap.budget_tokens, keep=None if gap.store_all else readable
    )
    if not (gap.store_all and (folded.text or folded.scoped)):
        return folded, False
    new = replace(folded, updated_at_ms=now_ms())
    with contextlib.suppress(Conflict):
        await store.set_summary(session.session_id, new, expected_through_seq=0)
        session.summary = new
        return new, True
    return folded, False


# --- A client's summary (SubmitSummary) ----------------------------------------------------------------
# SubmitSummary: the ``client`` provider, where the agent summarizes with its own model.
#
# The agent's text becomes the session-wide part of the summary. The turns only some agents may read are
# folded into their scopes' parts here, extractively, so that a client summary never has to carry them
# (and no viewer loses them): see ``summarizers.summarizer``.

# Least budget of a scope's part folded at submission (the client's text sets it when longer).
_MIN_SCOPED_TOKENS = 128


def _check(session_id: str, text: str, after_seq: int, through_seq: int, through_message_id: str) -> None:
    if not session_id:
        raise InvalidArgument("session_id is required")
    if not text.strip():
        raise InvalidArgument("text is required")
    if after_seq < 0 or through_seq <= after_seq:
        raise InvalidArgument("through_seq must be greater than after_seq (and after_seq >= 0)")
    if not through_message_id:
        raise InvalidArgument("through_message_id is required")


async def submit_summary(
    store: SessionStore,
    count: Callable[[list[str], str], Awaitable[list[int]]],
    summarizer: Summarizer,
    max_summary_tokens: int,
    *,
    session_id: str,
    text: str,
    after_seq: int,
    through_seq: int,
    through_message_id: str,
) -> Summary:
    _check(session_id, text, after_seq, through_seq, through_message_id)
    session = await store.get(session_id)
    stored = session.summary
    if (
        stored.through_seq == through_seq
        and stored.through_message_id == through_message_id
        and stored.text == text
    ):
        return stored  # a retry of a submission that already landed
    if stored.through_seq != after_seq:
        raise Conflict(
            f"stale summary: it continues turn {after_seq} but the stored summary covers through "
            f"turn {stored.through_seq}; summarize from there"
        )
    if through_seq > session.last_seq:
        raise InvalidArgument(
            f"through_seq {through_seq} is beyond the session's last turn {session.last_seq}"
        )
    leaving = await store.range_by_seq(session_id, after_seq, through_seq, through_seq - after_seq)
    if not leaving or leaving[-1].seq != through_seq or leaving[-1].message_id != through_message_id:
        raise InvalidArgument(
            f"through_message_id {through_message_id!r} is not the turn at seq {through_seq}"
        )
    tokens = (await count([text], session.model))[0]
    if tokens > max_summary_tokens:
        raise ResourceExhausted(f"summary has {tokens} tokens; the limit is {max_summary_tokens}")
    scoped = [m for m in leaving if scope_of(m) != SESSION_SCOPE]
    folded = await fold_scoped(summarizer, stored, scoped, max(_MIN_SCOPED_TOKENS, tokens))
    new = replace(
        folded,
        text=text,
        token_count=tokens,
        through_message_id=through_message_id,
        through_seq=through_seq,
        updated_at_ms=now_ms(),
    )
    await store.set_summary(session_id, new, expected_through_seq=after_seq)
    return new


# --- Background summarization --------------------------------------------------------------------------
# Background summarization: off the request path and out of the serving process, persisted by
# compare-and-set.
#
# Assembly decides *what* should leave the window (a ``SummaryRange``); ``SummaryScheduler`` (serving)
# queues one summarize job for it on the background job stream, and a worker's ``SummaryWriter`` runs the
# summarizer on just those turns and the previous summary, then stores the result with
# ``set_summary(expected_through_seq=previous)``. If another writer (a client ``SubmitSummary``, a
# resumption) moved the summary meanwhile, the store raises ``Conflict`` and this result is dropped: the
# next assembly plans again. The summarizer is CPU work in Python (the extractive one holds the interpreter
# lock while it scores sentences), which is why it never runs where requests are served.

log = logging.getLogger("memlane.context")


# One job per session and range: assemblies meanwhile (the summary lands a moment later) queue no more,
# unless the last one is this old (lost with a worker that died before taking it, say).
_REQUEUE_AFTER_S = 30.0


class SummaryScheduler:
    """The serving half: queues a summarize job when assembly asks for one (no I/O on the request path:
    the XADD runs in a task)."""

    def __init__(self, queue: SessionEndQueue) -> None:
        self._queue = queue
        self._queued: dict[str, tuple[int, float]] = {}  # session -> (through_seq, monotonic time)
        self._tasks: set[asyncio.Task[None]] = set()

    def schedule(self, session_id: str, rng: SummaryRange) -> bool:
        """Queues summarizing ``rng`` unless a job for this range (or a later one) was queued lately."""
        now = time.monotonic()
        last = self._queued.get(session_id)
        if last is not None and last[0] >= rng.through_seq and now - last[1] < _REQUEUE_AFTER_S:
            return False
        self._queued[session_id] = (rng.through_seq, now)
        if len(self._queued) > _MAX_REMEMBERED:
            self._queued = {k: v for k, v in self._queued.items() if now - v[1] < _REQUEUE_AFTER_S}
        task = asyncio.create_task(self._enqueue(session_id, rng), name=f"summarize:{session_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _enqueue(self, session_id: str, rng: SummaryRange) -> None:
        try:
            await self._queue.enqueue(
                session_id, REASON_SUMMARIZE, now_ms(), through_seq=rng.through_seq, budget=rng.budget_tokens
            )
        except Exception:  # the next assembly over the threshold asks again
            self._queued.pop(session_id, None)
            log.warning("could not queue a summary", extra={"session_id": session_id}, exc_info=True)

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


_MAX_REMEMBERED = 10_000


class SummaryWriter:
    """A worker's half: runs one summarize job."""

    def __init__(
        self,
        store: SessionStore,
        summarizer: Summarizer,
        counter: TokenCounter,
        executor: Executor | None = None,
    ) -> None:
        self._store = store
        self._summarizer = summarizer
        self._counter = counter
        self._executor = executor

    async def run(self, session_id: str, through_seq: int, budget_tokens: int) -> Summary | None:
        """A queued job: the summary stored, or None when it was superseded or failed (logged)."""
        try:
            return await self.summarize(session_id, through_seq, budget_tokens)
        except Conflict as exc:
            log.info("summary superseded", extra={"session_id": session_id, "detail": str(exc)})
        except MemlaneError as exc:
            log.warning("summarization failed", extra={"session_id": session_id, "detail": str(exc)})
        return None

    async def summarize(self, session_id: str, through_seq: int, budget_tokens: int) -> Summary:
        """Folds the turns up to ``through_seq`` that the stored summary lacks into it, and stores it."""
        session = await self._store.get(session_id)
        prev = session.summary
        if prev.through_seq >= through_seq:
            return prev
        # Read only the leaving turns: the previous summary stands for everything before them.
        leaving = await self._store.range_by_seq(
            session_id, prev.through_seq, through_seq, limit=through_seq - prev.through_seq
        )
        if not leaving:
            return prev
        # Every scope's turns are folded into that scope's part (see summarizers.summarizer), so no turn
        # leaves the window without landing in the summary of everyone who may read it.
        folded = await fold_scoped(self._summarizer, prev, leaving, budget_tokens)
        loop = asyncio.get_running_loop()
        tokens = await loop.run_in_executor(self._executor, self._counter.count, folded.text, session.model)
        new = replace(folded, token_count=tokens, updated_at_ms=now_ms())
        await self._store.set_summary(session_id, new, expected_through_seq=prev.through_seq, read=session)
        return new
