"""The batch limits an operator configures (``max_message_bytes``, ``max_batch_messages``,
``max_batch_bytes``) bound every call that takes a batch of messages, not AppendMessages alone:
ExtractMemories and ImportUserData used to check against the built-in defaults, so a server told to take
at most 5 messages of 1,000 bytes still extracted from 6 and imported a message of 1,001 bytes. Each
refusal sits beside a control within the configured limits that is accepted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

import memlane
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import session_pb2 as spb
from memlane_server.background import SidecarThread
from tests.conftest import ServerFactory


@pytest.fixture(scope="module")
def small(start_server: ServerFactory) -> SidecarThread:
    """Limits far under the defaults (256 KiB, 500 messages, 4 MiB), so the defaults would accept all."""
    return start_server(max_message_bytes=1000, max_batch_messages=5, max_batch_bytes=3000)


@pytest.fixture(scope="module")
def c(small: SidecarThread) -> Iterator[memlane.Client]:
    with memlane.Client(small.target, timeout=60) as client:
        yield client


def _turns(*texts: str) -> list[spb.Message]:
    return [spb.Message(message_id=f"m{i}", role=spb.ROLE_USER, content=t) for i, t in enumerate(texts)]


def test_extract_memories_takes_the_configured_batch_limits(c: memlane.Client, user_id: str) -> None:
    caller = mpb.Caller(user_id=user_id, agent_id="agent-a")
    with pytest.raises(memlane.ResourceExhaustedError, match="batch has 6 messages; at most 5"):
        c.extract_memories(caller=caller, session_id="s1", messages=_turns(*["Hello there."] * 6))
    with pytest.raises(
        memlane.ResourceExhaustedError, match=r"messages\[0\] is 1001 bytes; the limit is 1000"
    ):
        c.extract_memories(caller=caller, session_id="s1", messages=_turns("y" * 1001))
    with pytest.raises(memlane.ResourceExhaustedError, match="batch is 3600 bytes; the limit is 3000"):
        c.extract_memories(caller=caller, session_id="s1", messages=_turns(*["z" * 900] * 4))
    # Control: five messages, each and all within the limits, are taken.
    out = c.extract_memories(
        caller=caller,
        session_id="s1",
        messages=_turns("I live in Lisbon.", "Hello.", "Thanks.", "x" * 1000, "Bye."),
    )
    assert "User lives in Lisbon." in [m.memory.content for m in out.memories]


def _export_file(user: str, contents: list[str]) -> tuple[bytes, str]:
    """A user's export by hand: one session and its messages, as ``memlane export-user`` writes them."""
    sid = f"imp-{uuid.uuid4().hex[:8]}"
    head = {"record": "header", "format": "memlane.user-export", "format_version": 1, "user_id": user}
    records: list[dict[str, Any]] = [head, {"record": "session", "session_id": sid, "user_id": user}]
    records += [
        {
            "record": "message",
            "session_id": sid,
            "message_id": f"m{seq}",
            "seq": seq,
            "role": "user",
            "content": text,
        }
        for seq, text in enumerate(contents, start=1)
    ]
    return b"".join(orjson.dumps(r) + b"\n" for r in records), sid


def test_import_takes_the_configured_message_limit(c: memlane.Client, user_id: str) -> None:
    too_large, _ = _export_file(user_id, ["Hello.", "y" * 1001])
    with pytest.raises(memlane.ResourceExhaustedError, match="is 1001 bytes; the limit is 1000"):
        c.import_user_data(data=too_large)
    assert b"".join(r.data for r in c.export_user_data(user_id=user_id)) == b""  # nothing written
    # Control: a session longer than one batch, each message within the limit, imports whole (a file
    # holds a session's turns however many calls appended them).
    fits, sid = _export_file(user_id, [f"turn {i}" for i in range(7)] + ["x" * 1000])
    receipt = c.import_user_data(data=fits)
    assert receipt.imported["session"] == 1 and receipt.imported["message"] == 8
    stored = c.list_messages(session_id=sid, page_size=100).messages
    assert [m.content for m in stored][-2:] == ["turn 6", "x" * 1000] and len(stored) == 8


def test_import_cuts_a_session_where_a_call_would_by_its_bytes(c: memlane.Client, user_id: str) -> None:
    # Five turns of 900 bytes: within the message limit and the batch's count (5), over its bytes (3000)
    # together. Appended, they took two calls at least; imported, they are checked as two batches too.
    turns = [f"{i}" + "z" * 899 for i in range(5)]
    fits, sid = _export_file(user_id, turns)
    receipt = c.import_user_data(data=fits)
    assert receipt.imported["message"] == 5
    assert [m.content for m in c.list_messages(session_id=sid, page_size=100).messages] == turns
