"""Every id in every request, checked against the one id grammar (``memlane_server.ids``) before any
handler runs. Ids are recognised by field name, in nested messages too (``messages[3].source_agent_id``),
so a new RPC is covered the day it is added; an empty field is left to its handler (required or not)."""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from ..ids import check_id

# Field names that hold ids of users, agents, groups, sessions, channels, memories, messages, traces.
ID_FIELDS = frozenset(
    {
        "user_id",
        "agent_id",
        "session_id",
        "memory_id",
        "message_id",
        "trace_id",
        "source_agent_id",
        "source_session_id",
        "through_message_id",
        "group",
        "visibility_group",
        "channel",
        "groups",
        "participants",
        "message_ids",
        "source_agent_ids",
        "source_message_ids",
        "procedure_id",
        "snapshot_id",
        "backup_snapshot_id",
    }
)


# Fields that share an id's name but hold a framework's own names: a LangGraph channel (``__start__``,
# ``__error__``) is a key inside one checkpoint, never a Redis key, path or predicate; the checkpoint
# store bounds it (``sessions.checkpoints``).
NOT_IDS = frozenset({"memlane.v1.ChannelValue.channel", "memlane.v1.PendingWrite.channel"})


def check_request_ids(request: Message, prefix: str = "") -> None:
    """Raises InvalidArgument naming the first field (as a path) whose id is not valid."""
    for field, value in request.ListFields():
        path = f"{prefix}{field.name}"
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                continue  # metadata maps hold free text, not ids
            if field.is_repeated:
                for i, item in enumerate(value):
                    check_request_ids(item, f"{path}[{i}].")
            else:
                check_request_ids(value, f"{path}.")
        elif (
            field.name in ID_FIELDS
            and field.type == FieldDescriptor.TYPE_STRING
            and field.full_name not in NOT_IDS
        ):
            if field.is_repeated:
                for i, item in enumerate(value):
                    check_id(item, f"{path}[{i}]")
            else:
                check_id(value, path, required=False)
