"""The gap summary: when the stored summary is behind, the turns it lacks are folded in for this
request with the fast extractive summarizer (off the loop), per scope like any summary.

A session without any summary (a resumption) stores the fold of every scope, so the next request starts
from it; losing that race to another writer (the background run, a client) is fine.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

from ..access.identity import Caller
from ..errors import Conflict
from ..sessions.model import Session, Summary
from ..sessions.store import SessionStore
from ..summarizers import ExtractiveSummarizer
from ..summarizers.summarizer import Scope, fold_scoped
from .core import GapFold
from .traces import now_ms
from .viewer_summary import can_read


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
