"""The Summarizer contract, and the wrappers around a summarizer: metered (Prometheus) and scoped (one
summary per visibility scope).

The summarizer protocol: incremental, budgeted, with token accounting.

Summarization metrics, by provider, and a wrapper that records them.

Rolling summaries by visibility scope, with any ``Summarizer``.

A session's turns are not all readable by every agent: in distributed and selective sessions most are
private to their agent or to a group. One summary text cannot serve them all (it would either leak a
private turn to the others or leave it out for its own agent), so turns are summarized per scope:

- the session-wide turns into ``Summary.text`` (what every agent reads),
- each agent's private turns into one ``ScopedSummary`` (visibility AGENT, that agent),
- each agent's turns to a group into one ``ScopedSummary`` (visibility GROUP, that agent and group).

A scope is as fine as the access rule (``Caller.can_see`` looks at visibility, source agent and group),
so a viewer is given a scope's summary exactly when it may read every turn in it. All scopes share one
``through_seq``: a summary advances for everybody at once. Transient turns are scratch and never kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry

from ..observability.metrics import ModelUsageMetrics
from ..sessions.model import Message, ScopedSummary, Summary, VisibilityKind


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """A new rolling summary and what producing it cost.

    ``tokens_in``/``tokens_out`` are what the provider billed (an LLM's ``usage``) or, for offline
    providers, the tokens read and written; they feed the summarization metrics.
    """

    text: str
    token_count: int  # tokens of ``text`` in the summarizer's encoding; always <= the budget asked for
    tokens_in: int
    tokens_out: int
    provider: str


@runtime_checkable
class Summarizer(Protocol):
    """new summary = f(previous summary, turns leaving the window).

    Implementations never see turns older than ``leaving``: the previous summary stands for them. That
    keeps cost proportional to the turns leaving, not to the session's length.
    """

    @property
    def provider(self) -> str:
        """A short provider name for metrics and stats (``extractive``, ``openai``, ``client``)."""
        ...

    async def summarize(self, previous: str, leaving: list[Message], budget_tokens: int) -> SummaryResult:
        """Fold ``leaving`` (oldest first) into ``previous``; the result fits in ``budget_tokens``."""
        ...


# --- Summarization metrics, by provider, and a wrapper that records them.


class SummarizationMetrics(ModelUsageMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry, "summarization")


class MeteredSummarizer:
    """A ``Summarizer`` that records calls, tokens and latency of the one it wraps."""

    def __init__(self, inner: Summarizer, metrics: SummarizationMetrics) -> None:
        self._inner = inner
        self._metrics = metrics

    @property
    def provider(self) -> str:
        return self._inner.provider

    async def summarize(self, previous: str, leaving: list[Message], budget_tokens: int) -> SummaryResult:
        provider = self._inner.provider
        result = await self._metrics.timed(provider, self._inner.summarize(previous, leaving, budget_tokens))
        self._metrics.tokens(provider, result.tokens_in, result.tokens_out)
        return result


# --- Rolling summaries by visibility scope, with any ``Summarizer``.


@dataclass(frozen=True, slots=True, order=True)
class Scope:
    visibility: VisibilityKind
    agent_id: str = ""
    group: str = ""


SESSION_SCOPE = Scope(VisibilityKind.SESSION)


def scope_of(m: Message) -> Scope:
    """The scope of a turn. Anything but AGENT and GROUP is session-wide, as for ``Caller.can_see``."""
    if m.visibility == VisibilityKind.AGENT:
        return Scope(VisibilityKind.AGENT, m.source_agent_id)
    if m.visibility == VisibilityKind.GROUP:
        return Scope(VisibilityKind.GROUP, m.source_agent_id, m.visibility_group)
    return SESSION_SCOPE


def scope_of_part(part: ScopedSummary) -> Scope:
    return Scope(part.visibility, part.agent_id, part.group)


async def fold_scoped(
    summarizer: Summarizer,
    previous: Summary,
    leaving: list[Message],
    budget_tokens: int,
    *,
    keep: Callable[[Scope], bool] | None = None,
) -> Summary:
    """``previous`` with ``leaving`` (oldest first, after its range) folded in, scope by scope.

    Each scope's turns go to the summarizer with that scope's previous text only, within
    ``budget_tokens``; scopes without leaving turns keep their text. ``keep`` limits the work (and the
    result) to some scopes, e.g. those one viewer may read, for a summary that is shown, not stored.
    The result covers through the last leaving turn; its ``updated_at_ms`` is the previous one's.
    """
    if not leaving:
        return previous
    wanted = keep or (lambda _scope: True)
    turns: dict[Scope, list[Message]] = {}
    for m in leaving:
        if not m.transient and wanted(scope := scope_of(m)):
            turns.setdefault(scope, []).append(m)
    texts = {scope_of_part(p): (p.text, p.token_count) for p in previous.scoped}
    texts[SESSION_SCOPE] = (previous.text, previous.token_count)
    scopes = list(turns)
    results = await asyncio.gather(
        *(summarizer.summarize(texts.get(s, ("", 0))[0], turns[s], budget_tokens) for s in scopes)
    )
    for scope, result in zip(scopes, results, strict=True):
        texts[scope] = (result.text, result.token_count)
    text, tokens = texts.pop(SESSION_SCOPE)
    scoped = [
        ScopedSummary(scope.visibility, scope.agent_id, scope.group, t, n)
        for scope, (t, n) in sorted(texts.items())
        if t and wanted(scope)
    ]
    if not wanted(SESSION_SCOPE):
        text, tokens = "", 0
    return replace(
        previous,
        text=text,
        token_count=tokens,
        through_message_id=leaving[-1].message_id,
        through_seq=leaving[-1].seq,
        scoped=scoped,
    )
