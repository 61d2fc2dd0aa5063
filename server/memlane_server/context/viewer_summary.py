"""The summary one viewer is shown: the session-wide part plus the scoped parts it may read.

Parts are stored per visibility scope (``summarizers.scoped``); which of them a viewer gets is decided
by ``Caller.can_see``, the one access rule, on the scope's visibility, source agent and group, exactly as
for the turns themselves. Composing is cheap (no summarizer call), so it happens on every request.
"""

from __future__ import annotations

from dataclasses import replace

from ..access.identity import Caller
from ..sessions.model import ScopedSummary, Summary, VisibilityKind
from ..summarizers.summarizer import Scope
from ..tokens import TokenCounter

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
