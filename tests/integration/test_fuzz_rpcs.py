"""Fuzzes every RPC of memlane.v1 through the real server and the real client.

Requests are generated from the proto descriptors (so an RPC added later is fuzzed without touching this
file): every field filled or not, strings hostile (quotes, SQL and Lua fragments, newlines, NUL, path
traversal, long runs, non-Latin text) or valid-looking ids that name real objects, integers over their
whole range, enums with unknown values, nested messages, lists and maps. Each call must end in a status
its proto comment documents ("Errors: ..."), never INTERNAL or UNKNOWN.

The number of examples per RPC is bounded for CI ($MEMLANE_FUZZ_EXAMPLES, default 20); raise it locally.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message as ProtoMessage
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memlane
from memlane.v1 import admin_pb2, checkpoint_pb2, context_pb2, memory_pb2, procedure_pb2, session_service_pb2
from memlane_server.background import SidecarThread
from memlane_server.ltm.model import MemoryFilter, Visibility
from memlane_server.ltm.service import page_query
from memlane_server.paging import encode_token, query_fingerprint

EXAMPLES = int(os.environ.get("MEMLANE_FUZZ_EXAMPLES", "20"))
PROTOS = Path(__file__).resolve().parents[2] / "protos"
MODULES = (session_service_pb2, context_pb2, memory_pb2, admin_pb2, checkpoint_pb2, procedure_pb2)
# Any call may meet these whatever its comment says: the transport's, and the client's own deadline.
ALWAYS = {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
_CODES = {c.name for c in grpc.StatusCode}

FUZZ_USER = "fuzz-user"
FUZZ_SESSION = "fuzz-session"
FUZZ_AGENT = "fuzz-agent"
FUZZ_MEMORY = "fuzz-memory"
HOSTILE = [
    "",
    " ",
    "' OR '1'='1",
    '"; DROP TABLE items; --',
    "user_id = 'x' OR 1=1",
    "\\",
    "%",
    "_",
    "*",
    "\n",
    "a\nb",
    "x\r\n",
    "\x00",
    "\t",
    "../../etc/passwd",
    "/",
    "{tag}",
    "}{",
    "redis.call('FLUSHALL')",
    "return 1",
    "0",
    "-1",
    "18446744073709551616",
    "1\n",
    "1-2",
    "$",
    ">",
    "+inf",
    "-inf",
    "(1",
    "[",
    "true",
    "null",
    "NaN",
    "\u202e\u0663\u0664",
    "ß" * 3,
    "漢字",
    "🙂",
    "x" * 300,
    "y" * 5000,
    FUZZ_USER,
    FUZZ_SESSION,
    FUZZ_AGENT,
    FUZZ_MEMORY,
]
_STRINGS = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,20}", fullmatch=True),
)
_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _int(lo: int, hi: int) -> st.SearchStrategy[int]:
    small = st.integers(min_value=max(lo, -3), max_value=min(hi, 1100))
    times = st.integers(min_value=max(lo, 0), max_value=min(hi, 4_102_444_800_000))  # up to 2100
    return st.one_of(
        small, small, small, st.sampled_from([lo, hi]), times, st.integers(min_value=lo, max_value=hi)
    )


def _page_tokens() -> list[str]:
    """Page tokens in the server's format: bound to the queries a fuzzed listing most often makes (so
    they pass the format and binding checks and reach the cursor's), holding cursors the server never
    issues; then the same cut short, and look-alikes of other formats."""
    queries = [
        page_query(Visibility(FUZZ_USER), MemoryFilter()),
        query_fingerprint("sessions", FUZZ_USER, 0, "", 0, 0, 0),
        query_fingerprint("traces", FUZZ_SESSION),
        "parked-jobs",  # api/admin.py: a listing with no parameters
    ]
    cursors: list[list[Any]] = [
        [],
        [0, FUZZ_MEMORY],
        [2**63 - 1, FUZZ_SESSION],
        [-1, "x"],
        [2**64 - 1, "x"],
        [True, "x"],
        [1.5, "x"],
        [1, ""],
        [1, "x" * 300],
        [1, "' OR '1'='1"],
        [1, "a\\') OR true --"],
        ["1", 1],
        [None, None],
        [{"c": 1}, [1]],
        [1, 2],
        [1, 2, 3],
    ]
    tokens = [encode_token(q, c) for q in queries for c in cursors]
    return ["", *tokens, *(t[: len(t) // 2] for t in tokens[:8]), "AQ", "AQAAAAAAAAAAAAAAAAAAAAAAAA", "e30"]


# Values that get past the first checks, by field name, so the fuzz reaches the code behind them.
_SENSIBLE: dict[str, list[str]] = {
    "session_id": [FUZZ_SESSION],
    "user_id": [FUZZ_USER],
    "user_ids": [FUZZ_USER],
    "agent_id": ["", FUZZ_AGENT],
    "source_agent_id": ["", FUZZ_AGENT],
    "memory_id": [FUZZ_MEMORY],
    "message_id": ["m1", "m2"],
    "through_message_id": ["m1"],
    "content": ["I live in Pune.", "Hi there!", "My email is a@b.io"],
    "query": ["Where does the user live?"],
    "text": ["The user lives in Pune."],
    "format": ["langchain"],
    "json": ["{}", '{"a": [1, 2]}'],
    "page_token": _page_tokens(),
}
_ID = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,20}", fullmatch=True)


_NUMBERS = st.sampled_from(
    ["0", "1-0", "9" * 25, "18446744073709551616", "1-18446744073709551616", "-1", "1e9"]
)
_SUFFIXES = st.sampled_from(["\n", "\r\n", "\x00", " ", "'", '"', "\\", "*", "%", "}", "-", ":", "."])


def _string(field: FieldDescriptor) -> st.SearchStrategy[str]:
    """Mostly values that pass (so the fuzz gets past the first check), then near misses of them (a
    trailing newline, a quote, a 64-bit overflow), then anything."""
    sensible = _SENSIBLE.get(field.name)
    good = st.sampled_from(sensible) if sensible else _ID
    near = st.one_of(st.tuples(st.one_of(good, _NUMBERS), _SUFFIXES).map("".join), _NUMBERS)
    return st.one_of(*[good] * 5, near, near, _STRINGS)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return _string(field)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(
            st.floats(
                allow_nan=True, allow_infinity=True, width=32 if t == FieldDescriptor.TYPE_FLOAT else 64
            ),
            st.sampled_from([0.0, 0.5, 1.0, -1.0]),
            st.floats(min_value=0.0, max_value=1.0),
        )
    if t == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None  # every enum field has its descriptor
        known = st.sampled_from([v.number for v in field.enum_type.values])
        return st.one_of(*[known] * 6, st.integers(min_value=-(2**31), max_value=2**31 - 1))
    lo, hi = _INT_RANGES[t]
    return _int(lo, hi)


def _field_names(desc: Descriptor) -> list[str]:
    return [f.name for f in desc.fields]


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None  # every message field has its descriptor
        if field.message_type.full_name == "google.protobuf.FieldMask":
            names = st.sampled_from(_all_field_names())
            paths = st.one_of(*[names] * 6, _STRINGS)
            return st.lists(paths, min_size=1, max_size=3).map(lambda p: {"paths": p})
        return message_strategy(field.message_type, depth + 1)
    return _scalar(field)


_NAMES: list[str] = []


def _all_field_names() -> list[str]:
    """Field names of every message: realistic mask paths."""
    if not _NAMES:
        for module in MODULES:
            for desc in module.DESCRIPTOR.message_types_by_name.values():
                _NAMES.extend(_field_names(desc))
    return _NAMES


# Fields most requests need to get anywhere: present whenever their message is.
_USUALLY_SET = frozenset(
    {*_SENSIBLE, "caller", "messages", "role", "verdict", "update_mask", "session", "memory"}
)


def message_strategy(desc: Descriptor, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments for ``desc``'s class: a random subset of its fields (those most requests need,
    always), each a random value."""
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for field in desc.fields:
        if depth > 2 and field.type == FieldDescriptor.TYPE_MESSAGE:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f, val_f = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            parts[field.name] = st.dictionaries(_scalar(key_f), _value(val_f, depth), max_size=4)
        elif field.is_repeated:
            parts[field.name] = st.lists(
                _value(field, depth), min_size=field.name in _USUALLY_SET, max_size=4
            )
        else:
            parts[field.name] = _value(field, depth)
    # A request's own scalar fields are always set (each is what the fuzz is after); nested ones vary.
    usual = {f.name for f in desc.fields if depth == 0 and f.type != FieldDescriptor.TYPE_MESSAGE}
    required = {k: v for k, v in parts.items() if k in _USUALLY_SET or k in usual}
    optional = {k: v for k, v in parts.items() if k not in required}
    return st.fixed_dictionaries(required, optional=optional)


def _build(cls: type[ProtoMessage], fields: dict[str, Any]) -> ProtoMessage:
    return cls(**fields)


def _documented() -> dict[str, set[str]]:
    """Per RPC, the status codes its comment lists after "Errors:"."""
    out: dict[str, set[str]] = {}
    for proto in PROTOS.glob("memlane/v1/*.proto"):
        comment: list[str] = []
        for line in proto.read_text().splitlines():
            s = line.strip()
            if s.startswith("//"):
                comment.append(s[2:])
                continue
            m = re.match(r"rpc\s+(\w+)\s*\(", s)
            if m:
                text = " ".join(comment)
                errors = text.split("Errors:", 1)[1] if "Errors:" in text else ""
                out[m.group(1)] = {w for w in re.findall(r"\b[A-Z_]{5,}\b", errors) if w in _CODES}
            comment = []
    return out


def _methods() -> Iterator[tuple[str, MethodDescriptor]]:
    for module in MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                yield re.sub(r"(?<!^)(?=[A-Z])", "_", method.name).lower(), method


METHODS = sorted(_methods(), key=lambda m: m[0])
DOCUMENTED = _documented()


def test_every_rpc_documents_its_errors() -> None:
    # Every rpc in protos/ is fuzzed: a service module missing from MODULES shows up here.
    assert {m.name for _, m in METHODS} == set(DOCUMENTED)
    for _, method in METHODS:
        assert DOCUMENTED.get(method.name), f"{method.name}: no 'Errors:' in its proto comment"


def _seed(c: memlane.Client) -> None:
    """Fresh objects for the sensible values to name (a fuzzed CloseSession, ForgetUser or DeleteMemory
    of an earlier RPC's run must not leave the next one only NOT_FOUND)."""
    c.forget_user(user_id=FUZZ_USER)
    c.create_session(session_id=FUZZ_SESSION, user_id=FUZZ_USER)
    c.append_messages(
        session_id=FUZZ_SESSION,
        messages=[memlane.Message(message_id="m1", role=memlane.Role.ROLE_USER, content="I live in Pune.")],
    )
    c.create_memory(
        caller=memory_pb2.Caller(user_id=FUZZ_USER),
        memory_id=FUZZ_MEMORY,
        kind=memory_pb2.MEMORY_KIND_FACT,
        content="User keeps bees.",
    )


@pytest.fixture(scope="module")
def fuzz_client(server: SidecarThread) -> Iterator[memlane.Client]:
    # No retries: a fuzz case must see its own status, not a retried one.
    with memlane.Client(server.target, timeout=10, retry=memlane.NO_RETRY) as c:
        yield c


def _call(client: memlane.Client, name: str, method: MethodDescriptor, request: ProtoMessage) -> None:
    rpc = getattr(client, name)
    if method.server_streaming:
        # Streams may be endless (WatchSessionEvents): read a few items within a short deadline.
        for n, _ in enumerate(rpc(request, timeout=0.3)):
            if n >= 3:
                break
    else:
        rpc(request)


@pytest.mark.parametrize(("name", "method"), METHODS, ids=[m[0] for m in METHODS])
def test_fuzz_rpc(fuzz_client: memlane.Client, name: str, method: MethodDescriptor) -> None:
    _seed(fuzz_client)
    cls = GetMessageClass(method.input_type)
    allowed = DOCUMENTED.get(method.name, set()) | ALWAYS

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
    )
    @given(fields=message_strategy(method.input_type))
    def run(fields: dict[str, Any]) -> None:
        try:
            request = _build(cls, fields)
        except (ValueError, TypeError):
            return  # not representable in protobuf (e.g. a float out of range for a float field)
        try:
            _call(fuzz_client, name, method, request)
        except memlane.MemlaneError as exc:
            code = exc.code.name
            assert code not in ("INTERNAL", "UNKNOWN"), f"{method.name}({request}) -> {code}: {exc}"
            assert code in allowed, (
                f"{method.name}({request}) -> {code} (documented: {sorted(allowed)}): {exc}"
            )

    run()
