"""Channel policies choose how context is assembled: precedence request > session metadata > channel >
server setting, validated when the policies load. Through the real client, server and Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import memlane
from memlane import Message, Role
from memlane.v1 import context_pb2 as cpb
from memlane_server.context import STRATEGY_METADATA_KEY
from memlane_server.sessions.model import PolicyError
from tests.conftest import ServerFactory

POLICIES = """
channels:
  web:   {kind: web_chat}                                    # built-in: sliding window of 12 turns
  voice: {context_strategy: sliding_window, context_window_turns: 5}
  audit: {context_strategy: full_buffer}
  chat:  {kind: messaging}                                   # built-in: hybrid
"""


@pytest.fixture(scope="module")
def client(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[memlane.Client]:
    path = tmp_path_factory.mktemp("policies") / "channels.yaml"
    path.write_text(POLICIES)
    srv = start_server(channel_policies_file=str(path), context_strategy="rolling_summary", ltm_enabled=False)
    with memlane.Client(srv.target, timeout=10) as c:
        yield c


def _session(c: memlane.Client, channel: str, n: int = 40, metadata: dict[str, str] | None = None) -> str:
    user = f"u-{uuid.uuid4().hex[:8]}"
    sid = c.create_session(user_id=user, channel=channel, metadata=metadata or {}).session.session_id
    c.append_messages(
        session_id=sid,
        messages=[
            Message(role=Role.ROLE_USER if i % 2 else Role.ROLE_ASSISTANT, content=f"turn {i} of {channel}")
            for i in range(1, n + 1)
        ],
    )
    return sid


def _assemble(
    c: memlane.Client,
    sid: str,
    strategy: cpb.ContextStrategy.ValueType = cpb.CONTEXT_STRATEGY_UNSPECIFIED,
    window_turns: int = 0,
) -> tuple[int, list[int]]:
    """The strategy used and the seqs of the verbatim turns."""
    seqs: list[int] = []
    used = 0
    for part in c.assemble_context(
        session_id=sid, context_window_tokens=8000, strategy=strategy, window_turns=window_turns
    ):
        for block in part.blocks:
            if block.provenance == cpb.PROVENANCE_CONVERSATION:
                seqs = [m.seq for m in block.messages]
        if part.HasField("stats"):
            used = part.stats.strategy
    return used, seqs


def test_the_channel_policy_sets_strategy_and_window(client: memlane.Client) -> None:
    strategy, seqs = _assemble(client, _session(client, "web"))
    assert strategy == cpb.CONTEXT_STRATEGY_SLIDING_WINDOW and seqs == list(range(29, 41))
    strategy, seqs = _assemble(client, _session(client, "voice"))
    assert strategy == cpb.CONTEXT_STRATEGY_SLIDING_WINDOW and seqs == list(range(36, 41))
    strategy, seqs = _assemble(client, _session(client, "audit"))
    assert strategy == cpb.CONTEXT_STRATEGY_FULL_BUFFER and seqs == list(range(1, 41))
    strategy, _ = _assemble(client, _session(client, "chat"))
    assert strategy == cpb.CONTEXT_STRATEGY_HYBRID


def test_a_channel_without_a_strategy_gets_the_server_setting(client: memlane.Client) -> None:
    # The positive control of the channel test: the same server, an unlisted channel.
    strategy, _ = _assemble(client, _session(client, "email"))
    assert strategy == cpb.CONTEXT_STRATEGY_ROLLING_SUMMARY


def test_precedence_request_then_metadata_then_channel(client: memlane.Client) -> None:
    pinned = _session(client, "web", metadata={STRATEGY_METADATA_KEY: "full_buffer"})
    strategy, seqs = _assemble(client, pinned)
    assert strategy == cpb.CONTEXT_STRATEGY_FULL_BUFFER and len(seqs) == 40  # metadata beats the channel
    strategy, seqs = _assemble(client, pinned, strategy=cpb.CONTEXT_STRATEGY_SLIDING_WINDOW, window_turns=3)
    assert strategy == cpb.CONTEXT_STRATEGY_SLIDING_WINDOW and seqs == [38, 39, 40]  # the request beats both
    strategy, seqs = _assemble(client, _session(client, "web"), strategy=cpb.CONTEXT_STRATEGY_SLIDING_WINDOW)
    assert seqs == list(range(29, 41))  # the channel's window when the request names none


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("channels:\n  web: {context_strategy: summary}\n", "channels.web.context_strategy"),
        ("default: {context_strategy: bogus}\n", "default.context_strategy"),
        ("channels:\n  web: {context_window_turns: -1}\n", "channels.web.context_window_turns"),
    ],
)
def test_a_bad_strategy_stops_the_server_naming_channel_and_field(
    start_server: ServerFactory, tmp_path: Path, body: str, field: str
) -> None:
    path = tmp_path / "channels.yaml"
    path.write_text(body)
    with pytest.raises(PolicyError, match=field.replace(".", r"\.")):
        start_server(channel_policies_file=str(path), ltm_enabled=False)
