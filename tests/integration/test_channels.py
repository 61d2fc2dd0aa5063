"""Across channels: the durable profile follows the user, raw conversation (episodes) does not."""

from __future__ import annotations

import memlane
from memlane import Message, Role
from memlane.v1 import context_pb2, memory_pb2


def _memory_texts(c: memlane.Client, sid: str, query: str) -> tuple[list[str], list[str]]:
    profile: list[str] = []
    memories: list[str] = []
    for part in c.assemble_context(session_id=sid, user_input=query, model="gpt-4o"):
        for block in part.blocks:
            texts = [m.content for m in block.messages]
            if block.provenance == context_pb2.PROVENANCE_PROFILE:
                profile += texts
            elif block.provenance == context_pb2.PROVENANCE_MEMORY:
                memories += texts
    return profile, memories


def test_profile_crosses_channels_episodes_do_not(client: memlane.Client, user_id: str) -> None:
    slack = client.create_session(user_id=user_id, channel="slack").session.session_id
    client.append_messages(
        session_id=slack,
        messages=[
            Message(role=Role.ROLE_USER, content="I live in Lisbon."),
            Message(role=Role.ROLE_ASSISTANT, content="Got it."),
            Message(role=Role.ROLE_USER, content="The quarterly offsite moved to the Marigold Hall venue."),
            Message(role=Role.ROLE_ASSISTANT, content="Noted: the offsite is now at Marigold Hall."),
        ],
    )
    client.promote_session(session_id=slack, close=True, timeout=120)
    stored = client.list_memories(caller=memory_pb2.Caller(user_id=user_id)).memories
    assert any(m.kind == memory_pb2.MEMORY_KIND_EPISODIC and "Marigold" in m.content for m in stored)

    web = client.create_session(user_id=user_id, channel="web").session.session_id
    profile, memories = _memory_texts(client, web, "Where is the offsite at Marigold Hall?")
    assert any("Lisbon" in t for t in profile), profile  # the user is recognized on the web too
    assert not any("Marigold" in t for t in memories), memories  # the Slack conversation stays there

    back = client.create_session(user_id=user_id, channel="slack").session.session_id
    _, memories = _memory_texts(client, back, "Where is the offsite at Marigold Hall?")
    assert any("Marigold" in t for t in memories), memories
