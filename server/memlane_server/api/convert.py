"""proto <-> domain for sessions and messages."""

from __future__ import annotations

from memlane.v1 import session_pb2 as pb

from ..errors import InvalidArgument
from ..sessions.model import Message, Session, Summary
from .enums import PROMOTION_STATE, ROLE, SESSION_STATUS, TOPOLOGY, VISIBILITY


def message_from_pb(m: pb.Message, index: int) -> Message:
    role, visibility = ROLE.from_pb(m.role), VISIBILITY.from_pb(m.visibility)
    if role is None:
        raise InvalidArgument(
            f"messages[{index}].role {m.role} is not a known role",
            field=f"messages[{index}].role",
            reason="UNKNOWN_VALUE",
        )
    if visibility is None:
        raise InvalidArgument(
            f"messages[{index}].visibility {m.visibility} is not a known visibility",
            field=f"messages[{index}].visibility",
            reason="UNKNOWN_VALUE",
        )
    return Message(
        message_id=m.message_id,
        session_id="",
        role=role,
        content=m.content,
        source_agent_id=m.source_agent_id,
        participant_name=m.participant_name,
        user_id=m.user_id,
        channel=m.channel,
        native_format=m.native.format,
        native_json=m.native.json,
        planning_steps=list(m.planning_steps),
        invoked=list(m.invoked),
        tool_call_ids=list(m.tool_call_ids),
        metadata=dict(m.metadata),
        transient=m.transient,
        visibility=visibility,
        visibility_group=m.visibility_group,
        created_at_ms=m.created_at_unix_ms,
    )


def message_to_pb(m: Message) -> pb.Message:
    out = pb.Message(
        message_id=m.message_id,
        session_id=m.session_id,
        role=ROLE.to_pb(m.role),
        content=m.content,
        seq=m.seq,
        source_agent_id=m.source_agent_id,
        participant_name=m.participant_name,
        user_id=m.user_id,
        channel=m.channel,
        planning_steps=m.planning_steps,
        invoked=m.invoked,
        tool_call_ids=m.tool_call_ids,
        metadata=m.metadata,
        transient=m.transient,
        visibility=VISIBILITY.to_pb(m.visibility),
        visibility_group=m.visibility_group,
        created_at_unix_ms=m.created_at_ms,
        token_count=m.token_count,
    )
    if m.native_format or m.native_json:
        out.native.format = m.native_format
        out.native.json = m.native_json
    return out


def summary_to_pb(s: Summary) -> pb.Summary:
    return pb.Summary(
        text=s.text,
        through_message_id=s.through_message_id,
        through_seq=s.through_seq,
        token_count=s.token_count,
        updated_at_unix_ms=s.updated_at_ms,
    )


def session_to_pb(s: Session) -> pb.Session:
    return pb.Session(
        session_id=s.session_id,
        user_id=s.user_id,
        agent_id=s.agent_id,
        channel=s.channel,
        participants=s.participants,
        group=s.group,
        tags=s.tags,
        metadata=s.metadata,
        status=SESSION_STATUS.to_pb(s.status),
        created_at_unix_ms=s.created_at_ms,
        last_activity_at_unix_ms=s.last_activity_at_ms,
        idle_at_unix_ms=s.idle_at_ms,
        closed_at_unix_ms=s.closed_at_ms,
        expired_at_unix_ms=s.expired_at_ms,
        summary=summary_to_pb(s.summary),
        token_total=s.token_total,
        message_count=s.message_count,
        promotion_state=PROMOTION_STATE.to_pb(s.promotion_state),
        model=s.model,
        ttl_seconds=s.ttl_seconds,
        topology=TOPOLOGY.to_pb(s.topology),
    )
