"""The procedure extractor: a few-shot example proposed from a session its agent marked successful
(``pipelines/promote.py ExtractingPromoter`` proposes it when the session is promoted).

Deliberately simple and honest. memlane cannot tell on its own whether a session went well, so it asks
the one who can: the agent (or an operator) sets the session's metadata ``memlane.outcome`` to
``success`` (CreateSession or UpdateSession). When such a session is promoted at session end, the
exchange that framed the task (the first user request) and the answer that closed it (the last assistant
turn after it) are proposed as an EXAMPLE procedure of the session's agent. Only session-wide turns are
used (a private or group turn must not reach every user of the agent), text holding personal data is not
proposed, and the version always waits for an operator's approval, whatever the agent's approval mode:
it quotes one user's conversation and will be shown in every other user's context once approved. It
records the session's user, so erasing that user erases the version.
"""

from __future__ import annotations

import hashlib

from ..sessions.model import Message, Role, Session, VisibilityKind
from ..sessions.procedure_model import Kind, Origin, Owner
from .service import MAX_CONTENT_CHARS, Proposal

OUTCOME_KEY = "memlane.outcome"
SUCCESS = "success"
EXTRACTOR_NAME = "memlane"
_TURN_CHARS = (MAX_CONTENT_CHARS - 200) // 2


def procedure_id_for(session_id: str) -> str:
    """One procedure per source session (a digest: the id grammar caps ids at 128 characters)."""
    return "example-" + hashlib.blake2b(session_id.encode(), digest_size=8).hexdigest()


def example_from(messages: list[Message]) -> tuple[str, list[str]] | None:
    """The (content, source message ids) of the example in these turns, or None."""
    shared = [m for m in messages if m.visibility == VisibilityKind.SESSION and not m.transient and m.content]
    request = next((m for m in shared if m.role == Role.USER), None)
    if request is None:
        return None
    after = shared[shared.index(request) + 1 :]
    answer = next((m for m in reversed(after) if m.role == Role.ASSISTANT), None)
    if answer is None:
        return None
    content = (
        "Example of a request handled well:\n"
        f"User: {request.content.strip()[:_TURN_CHARS]}\n"
        f"Assistant: {answer.content.strip()[:_TURN_CHARS]}"
    )
    return content, [request.message_id, answer.message_id]


def proposal_from(session: Session, messages: list[Message]) -> Proposal | None:
    """The example a session marked successful proposes to its agent, or None (not marked, or no
    framing request and closing answer among its session-wide turns)."""
    if session.metadata.get(OUTCOME_KEY, "").strip().lower() != SUCCESS:
        return None
    found = example_from(messages)
    if found is None:
        return None
    content, source_ids = found
    return Proposal(
        owner=Owner(agent_id=session.agent_id),
        procedure_id=procedure_id_for(session.session_id),
        content=content,
        kind=Kind.EXAMPLE,
        title=f"Example from a successful session ({session.channel or 'default'} channel)",
        reason="the session was marked successful (metadata memlane.outcome=success)",
        origin=Origin.EXTRACTOR,
        proposed_by=EXTRACTOR_NAME,
        source_session_id=session.session_id,
        source_message_ids=tuple(source_ids),
        source_user_id=session.user_id,
    )
