"""The graph's ``messages`` channel, mirrored into the memlane session's messages.

So memlane's summaries, context assembly, promotion to long-term memory and session lifecycle see a
LangGraph conversation with no extra code. Each LangChain message is appended once, under its own id
(a retry or a re-sent history is a no-op on the sidecar), with the LangChain object stored whole as
the native message. A message that left the channel (``RemoveMessage``) is removed from the session.
Only messages this mirror wrote are ever removed: they carry ``metadata[MIRROR_KEY]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage

from memlane.integrations.langchain._messages import to_message as lc_to_message
from memlane.v1 import session_pb2 as pb
from memlane.v1 import session_service_pb2 as spb

MIRROR_KEY = "langgraph.channel"
CHANNEL = "messages"


def to_message(m: BaseMessage) -> pb.Message:
    # Stored as MemlaneChatMessageHistory stores it, so either reads what the other wrote.
    return lc_to_message(m, message_id=str(m.id), metadata={MIRROR_KEY: CHANNEL})


@dataclass(slots=True)
class MirrorPlan:
    append: spb.AppendMessagesRequest | None
    remove: spb.RemoveMessagesRequest | None
    ids: set[str] = field(default_factory=set)  # the channel's ids once both ran


def plan(session_id: str, known: set[str], messages: Sequence[Any]) -> MirrorPlan:
    """What to send so the session holds exactly the channel's messages (among those mirrored)."""
    current = [m for m in messages if isinstance(m, BaseMessage) and m.id]
    ids = {str(m.id) for m in current}
    new = [to_message(m) for m in current if str(m.id) not in known]
    gone = sorted(known - ids)
    return MirrorPlan(
        append=spb.AppendMessagesRequest(session_id=session_id, messages=new) if new else None,
        remove=spb.RemoveMessagesRequest(session_id=session_id, message_ids=gone) if gone else None,
        ids=ids,
    )


def mirrored_ids(page: spb.ListMessagesResponse) -> set[str]:
    return {m.message_id for m in page.messages if m.metadata.get(MIRROR_KEY) == CHANNEL}
