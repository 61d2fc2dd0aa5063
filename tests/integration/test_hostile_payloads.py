"""Hostile payloads (issue 25): deeply nested native JSON, huge metadata maps on messages and memories,
and 100,000 tiny messages in one AppendMessages batch. Each ends with a clear error naming the field (or
the batch) and stores nothing of the refused request; a control of the same shape within the limits is
accepted. How fast the 100,000 are refused is a figure of `memlane bench`, not a bound here.

Through the real server: real Redis, LanceDB and ONNX embeddings, the real client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane import Message, NativeMessage, Role
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from memlane_server.config import Settings
from memlane_server.sessions.limits import MAX_NATIVE_DEPTH
from memlane_server.wiring.stores import session_limits
from tests.conftest import ServerFactory

LIMITS = session_limits(Settings().sessions)  # the sidecar below runs with the default settings


@pytest.fixture(scope="module")
def sidecar(start_server: ServerFactory) -> SidecarThread:
    return start_server()


@pytest.fixture(scope="module")
def c(sidecar: SidecarThread) -> Iterator[memlane.Client]:
    with memlane.Client(sidecar.target, timeout=30) as client:
        yield client


@pytest.fixture()
def sid(c: memlane.Client, user_id: str) -> str:
    return c.create_session(user_id=user_id, channel="web").session.session_id


def _count(c: memlane.Client, sid: str) -> int:
    return c.get_session(session_id=sid).session.message_count


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _native(json_text: str) -> Message:
    return Message(role=Role.ROLE_USER, content="hi", native=NativeMessage(format="openai", json=json_text))


@pytest.mark.parametrize("depth", [100_000, 1_024, MAX_NATIVE_DEPTH + 1])
def test_deeply_nested_native_json_is_invalid_argument(c: memlane.Client, sid: str, depth: int) -> None:
    # 100,000 levels were already refused (orjson stops past 1,024); 1,024 levels passed and were stored,
    # though Python's json.loads (the client's memlane/_chat.py reading a chat message back) raises
    # RecursionError from about 1,000.
    with pytest.raises(memlane.InvalidArgumentError) as caught:
        c.append_messages(session_id=sid, messages=[_native(_nested(depth))])
    assert caught.value.field == "messages[0].native.json"
    assert not caught.value.retryable
    assert _count(c, sid) == 0


def test_reasonably_nested_native_json_is_accepted_and_read_back(c: memlane.Client, sid: str) -> None:
    # Nested exactly to the limit (a dict, a list, a dict, then the arrays).
    doc = {
        "role": "user",
        "content": [{"type": "text", "text": "hi", "x": json.loads(_nested(MAX_NATIVE_DEPTH - 3))}],
    }
    text = json.dumps(doc)
    c.append_messages(session_id=sid, messages=[_native(text)])
    (back,) = c.list_messages(session_id=sid).messages
    assert json.loads(back.native.json) == doc


def _huge_maps() -> list[tuple[str, dict[str, str]]]:
    n, long = LIMITS.max_metadata_entries, "v" * (LIMITS.max_text_field_bytes + 1)
    return [
        ("many keys", {f"k{i}": "v" for i in range(100_000)}),
        ("a long key", {"k" * 100_000: "v"}),
        ("a long value", {"k": long}),
        ("one too many", {f"k{i}": "v" for i in range(n + 1)}),
    ]


@pytest.mark.parametrize(("label", "metadata"), _huge_maps(), ids=[m[0] for m in _huge_maps()])
def test_huge_message_metadata_is_refused_whole(
    c: memlane.Client, sid: str, label: str, metadata: dict[str, str]
) -> None:
    ok = Message(role=Role.ROLE_USER, content="first of the batch")
    bad = Message(role=Role.ROLE_USER, content="x", metadata=metadata)
    with pytest.raises((memlane.InvalidArgumentError, memlane.ResourceExhaustedError)) as caught:
        c.append_messages(session_id=sid, messages=[ok, bad])
    assert (caught.value.field or "").startswith("messages[1]"), caught.value
    assert _count(c, sid) == 0  # not even the good first message of the batch


@pytest.mark.parametrize(("label", "metadata"), _huge_maps(), ids=[m[0] for m in _huge_maps()])
def test_huge_memory_metadata_is_refused(
    c: memlane.Client, user_id: str, label: str, metadata: dict[str, str]
) -> None:
    who = mpb.Caller(user_id=user_id)
    with pytest.raises(memlane.InvalidArgumentError) as caught:
        c.create_memory(caller=who, kind=mpb.MEMORY_KIND_FACT, content="User likes tea.", metadata=metadata)
    assert (caught.value.field or "").startswith("metadata"), caught.value
    made = c.create_memory(caller=who, kind=mpb.MEMORY_KIND_FACT, content="User likes green tea.").memory
    with pytest.raises(memlane.InvalidArgumentError) as caught:
        c.update_memory(
            caller=who,
            memory=mpb.Memory(memory_id=made.memory_id, metadata=metadata),
            update_mask=FieldMask(paths=["metadata"]),
        )
    assert (caught.value.field or "").startswith("memory.metadata"), caught.value
    # Nothing stored partially: only the control memory, and its metadata untouched.
    listed = c.list_memories(caller=who, page_size=50).memories
    assert [(m.memory_id, dict(m.metadata)) for m in listed] == [(made.memory_id, {})]


def test_metadata_at_the_limits_is_accepted(c: memlane.Client, sid: str, user_id: str) -> None:
    n, w = LIMITS.max_metadata_entries, LIMITS.max_text_field_bytes
    full = {f"{i:0{w}d}": "v" * w for i in range(n)}
    c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="x", metadata=full)])
    assert dict(c.list_messages(session_id=sid).messages[0].metadata) == full
    made = c.create_memory(
        caller=mpb.Caller(user_id=user_id),
        kind=mpb.MEMORY_KIND_FACT,
        content="User likes tea.",
        metadata=full,
    ).memory
    assert dict(made.metadata) == full


def test_a_hundred_thousand_tiny_messages_are_refused_before_conversion(c: memlane.Client, sid: str) -> None:
    tiny = [Message(role=Role.ROLE_USER, content="x") for _ in range(100_000)]
    # The first message has a role no conversion accepts: had the 100,000 been converted before their
    # count was checked (2.0 s of the event loop, GetSession stalled 1.6 s meanwhile), the answer would be
    # INVALID_ARGUMENT on messages[0].role. How fast the refusal is, is measured by `memlane bench`
    # ("AppendMessages refused: 100,000 one-character messages"), not bounded here.
    unknown_role = Message(role=99, content="x")  # type: ignore[arg-type]  # hostile: no such role
    with pytest.raises(memlane.ResourceExhaustedError) as caught:
        c.append_messages(session_id=sid, messages=[unknown_role, *tiny[1:]])
    assert (caught.value.reason, caught.value.field) == ("BATCH_TOO_LARGE", "messages")
    assert _count(c, sid) == 0
    # Positive controls: that role alone is refused at conversion, naming it; a batch at the limit is
    # accepted whole.
    with pytest.raises(memlane.InvalidArgumentError) as refused:
        c.append_messages(session_id=sid, messages=[unknown_role])
    assert (refused.value.reason, refused.value.field) == ("UNKNOWN_VALUE", "messages[0].role")
    assert _count(c, sid) == 0
    c.append_messages(session_id=sid, messages=tiny[: LIMITS.max_batch_messages])
    assert _count(c, sid) == LIMITS.max_batch_messages
