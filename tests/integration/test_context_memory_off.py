"""A memory-off baseline per request (AssembleContextRequest.omit): the same assembly without long-term
memory, or without the summary, so a team can A/B what memory buys. Through the real server and client."""

from __future__ import annotations

from typing import Any

import pytest

import memlane
from memlane import Message, Role
from memlane.v1 import context_pb2 as cpb
from memlane_server.background import SidecarThread

PROFILE, MEMORY, SUMMARY = cpb.PROVENANCE_PROFILE, cpb.PROVENANCE_MEMORY, cpb.PROVENANCE_SUMMARY
WINDOW = {"context_window_tokens": 2000, "reserved_output_tokens": 200}


def _blocks(c: memlane.Client, sid: str, **fields: Any) -> dict[int, cpb.ContextBlock]:
    out: dict[int, cpb.ContextBlock] = {}
    for resp in c.assemble_context(session_id=sid, user_input="which plan did I choose?", **fields):
        for b in resp.blocks:
            out[b.provenance] = b
    return out


def _turns(n: int) -> list[Message]:
    return [
        Message(
            role=Role.ROLE_USER if i % 2 else Role.ROLE_ASSISTANT,
            content=f"Turn {i}: we talked about shipping options and the weather for a while, at length.",
        )
        for i in range(1, n + 1)
    ]


def test_memory_and_summary_can_be_left_out_per_request(server: SidecarThread, user_id: str) -> None:
    with memlane.Client(server.target, timeout=20) as c, memlane.Memlane(server.target, agent_id="bot") as m:
        m.remember(user_id, "The user chose the annual plan.")
        m.remember(user_id, "Prefers email.", kind=memlane.MemoryKind.MEMORY_KIND_PREFERENCE)
        # Recalled, and not in the profile (which the memory block does not repeat): an episode.
        m.remember(
            user_id, "User: which plan? I chose the annual one.", kind=memlane.MemoryKind.MEMORY_KIND_EPISODIC
        )
        sid = c.create_session(user_id=user_id, agent_id="bot").session.session_id
        c.append_messages(session_id=sid, messages=_turns(120))
        _blocks(c, sid, **WINDOW)  # no summary yet, history over budget: the gap is folded and stored
        summary = c.get_session(session_id=sid).session.summary
        assert summary.through_seq > 0 and summary.text

        full = _blocks(c, sid, **WINDOW)  # positive control: every section has content
        assert full[MEMORY].memories and full[PROFILE].memories
        assert summary.text in full[SUMMARY].messages[0].content
        recent = [m.message_id for m in full[cpb.PROVENANCE_CONVERSATION].messages]
        assert recent

        off = _blocks(c, sid, omit=[PROFILE, MEMORY], **WINDOW)
        assert not off[MEMORY].memories and not off[PROFILE].memories
        assert off[SUMMARY].messages[0].content == full[SUMMARY].messages[0].content
        assert [m.message_id for m in off[cpb.PROVENANCE_CONVERSATION].messages][-1] == recent[-1]

        no_summary = _blocks(c, sid, omit=[SUMMARY], **WINDOW)
        assert not no_summary[SUMMARY].messages
        assert no_summary[MEMORY].memories  # memory stays
        # The recent turns stay; none of the summarized ones come back in its place.
        kept = no_summary[cpb.PROVENANCE_CONVERSATION].messages
        assert kept and kept[-1].message_id == recent[-1] and kept[0].seq > summary.through_seq


@pytest.mark.parametrize("bad", [cpb.PROVENANCE_SYSTEM, cpb.PROVENANCE_CONVERSATION, 99])
def test_only_memory_and_summary_can_be_omitted(client: memlane.Client, user_id: str, bad: int) -> None:
    sid = client.create_session(user_id=user_id, agent_id="bot").session.session_id
    with pytest.raises(memlane.InvalidArgumentError):
        _blocks(client, sid, omit=[bad])
    assert _blocks(client, sid, omit=[MEMORY])  # positive control
