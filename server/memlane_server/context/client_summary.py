"""SubmitSummary: the ``client`` provider, where the agent summarizes with its own model.

The agent's text becomes the session-wide part of the summary. The turns only some agents may read are
folded into their scopes' parts here, extractively, so that a client summary never has to carry them
(and no viewer loses them): see ``summarizers.scoped``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from ..errors import Conflict, InvalidArgument, ResourceExhausted
from ..sessions.model import Summary
from ..sessions.store import SessionStore
from ..summarizers import Summarizer
from ..summarizers.summarizer import SESSION_SCOPE, fold_scoped, scope_of
from .traces import now_ms

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
