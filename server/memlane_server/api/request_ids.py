"""Every id in every request, put in NFC and checked against the one id grammar
(``memlane_server.ids``) before any handler runs. Ids are recognised by field name, in nested messages
too (``messages[3].source_agent_id``), so a new RPC is covered the day it is added; an empty field is
left to its handler (required or not)."""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from ..ids import check_id, normalized

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
        "memory_ids",
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


# What each field is to the check, decided once per field (descriptor lookups cost more than the check).
_SKIP, _MESSAGE, _MESSAGES, _ID, _IDS = range(5)
_KINDS: dict[str, int] = {}


def _kind(field: FieldDescriptor) -> int:
    kind = _KINDS.get(field.full_name)
    if kind is not None:
        return kind
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            kind = _SKIP  # metadata maps hold free text, not ids
        else:
            kind = _MESSAGES if field.is_repeated else _MESSAGE
    elif (
        field.name in ID_FIELDS
        and field.type == FieldDescriptor.TYPE_STRING
        and field.full_name not in NOT_IDS
    ):
        kind = _IDS if field.is_repeated else _ID
    else:
        kind = _SKIP
    _KINDS[field.full_name] = kind
    return kind


def check_request_ids(request: Message, prefix: str = "") -> None:
    """Rewrites every id in NFC (in place: the handler reads the normalized request), and raises
    InvalidArgument naming the first field (as a path) whose id is not valid."""
    for field, value in request.ListFields():
        kind = _kind(field)
        if kind == _SKIP:
            continue
        path = f"{prefix}{field.name}"
        if kind == _MESSAGE:
            check_request_ids(value, f"{path}.")
        elif kind == _MESSAGES:
            for i, item in enumerate(value):
                check_request_ids(item, f"{path}[{i}].")
        elif kind == _IDS:
            for i, item in enumerate(value):
                if (nfc := normalized(item)) != item:
                    value[i] = nfc
                check_id(nfc, f"{path}[{i}]")
        else:
            if (nfc := normalized(value)) != value:
                setattr(request, field.name, nfc)
            check_id(nfc, path, required=False)
