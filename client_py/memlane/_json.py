"""memlane's messages as JSON, one shape wherever they are printed (the ``memlane`` CLI, the MCP tools;
the user export names the same things the same way, docs/operations.md#export-format).

- Keys are the proto's field names (``memory_id``, ``created_at_unix_ms``), not protobuf's lowerCamel.
- Integers are JSON numbers, 64-bit ones too: protobuf's own JSON mapping prints int64 as strings (for
  JavaScript's doubles), which made ``"token_total": "5"`` beside ``"seq": 1``; memlane's ids are
  strings and its counts and millisecond times stay far below 2^53.
- An enum value is its short lowercase name, the type's prefix dropped (``SESSION_STATUS_CLOSED``:
  ``closed``, ``MEMORY_KIND_FACT``: ``fact``), the spelling the CLI's flags and the MCP tools take; a
  number this client's proto does not name yet is ``unknown``, said so rather than guessed.
- A field at its default is left out, as protobuf's JSON mapping does (an empty ``slot`` is no slot).
"""

from __future__ import annotations

import base64
import math
import re
import struct
from typing import Any, Protocol, TypeVar

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

UNKNOWN = "unknown"
_V = TypeVar("_V", bound=int)
_CAMEL_HUMP = re.compile(r"(?<!^)(?=[A-Z])")


def _prefix(enum: EnumDescriptor) -> str:
    # The proto style guide's value prefix: the type's name in UPPER_SNAKE (SessionStatus: SESSION_STATUS_).
    return _CAMEL_HUMP.sub("_", enum.name).upper() + "_"


def enum_name(enum: EnumDescriptor, number: int) -> str:
    """The short lowercase name of ``number`` in ``enum`` (``UNKNOWN`` for a number it does not name)."""
    value = enum.values_by_number.get(number)
    if value is None:
        return UNKNOWN
    return value.name.removeprefix(_prefix(enum)).lower()


class _Enum(Protocol[_V]):
    """A generated enum type (``MemoryKind``): its values typed as that enum's, not as bare ints."""

    DESCRIPTOR: EnumDescriptor

    def items(self) -> list[tuple[str, _V]]: ...


def enum_names(enum: _Enum[_V]) -> dict[str, _V]:
    """Each short name of ``enum`` and its value, the unspecified 0 left out: what a caller may name."""
    return {enum_name(enum.DESCRIPTOR, v): v for _, v in enum.items() if v}


def to_json(message: Message) -> dict[str, Any]:
    """``message`` as a JSON-ready dict, in the shape this module's docstring describes."""
    return {f.name: _field(f, value) for f, value in message.ListFields()}


def _field(f: FieldDescriptor, value: Any) -> Any:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        out_value = f.message_type.fields_by_name["value"]
        return {str(k): _scalar(out_value, v) for k, v in value.items()}
    if f.is_repeated:
        return [_scalar(f, v) for v in value]
    return _scalar(f, value)


def _scalar(f: FieldDescriptor, value: Any) -> Any:
    if f.message_type is not None:
        if f.message_type.full_name.startswith("google.protobuf."):
            return MessageToDict(value)  # well-known types have their own JSON forms
        return to_json(value)
    if f.enum_type is not None:
        return enum_name(f.enum_type, value)
    if f.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)  # JSON has no NaN or infinity: protobuf's mapping writes them as text too
        if f.type == FieldDescriptor.TYPE_FLOAT:
            return _short_float(value)
    return value


def _short_float(value: float) -> float:
    """The shortest decimal that is the same 32-bit float (0.3, not 0.30000001192092896)."""
    single = struct.pack("<f", value)
    for digits in range(1, 10):
        shorter = float(f"{value:.{digits}g}")
        if struct.pack("<f", shorter) == single:
            return shorter
    return value
