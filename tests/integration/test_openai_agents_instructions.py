"""``memlane_instructions``: per turn, the agent's instructions plus memlane's profile, the memories
recalled for the current user turn and the session's summary, as the real SDK Runner sends them."""

from __future__ import annotations

import uuid

from agents import Agent, Runner, set_tracing_disabled

import memlane
from memlane.integrations.openai_agents import MemlaneSession, memlane_instructions
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from tests.agents_model import ScriptedModel, text

set_tracing_disabled(True)


async def test_instructions_carry_profile_memories_and_summary(
    server: SidecarThread, client: memlane.Client
) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    caller = mpb.Caller(user_id=user)
    client.create_memory(caller=caller, kind=mpb.MEMORY_KIND_PREFERENCE, content="Prefers metric units")
    client.create_memory(caller=caller, kind=mpb.MEMORY_KIND_FACT, content="Is allergic to peanuts")
    # Recalled, never in the profile (an episode of the session's channel, where episodes stay): the
    # memories section has something of its own, since a memory the profile holds is not injected twice.
    client.create_memory(
        caller=caller,
        kind=mpb.MEMORY_KIND_EPISODIC,
        content="Asked for nut-free snack ideas because of the peanut allergy",
        channel="openai-agents",
    )
    session = MemlaneSession(f"oa-{uuid.uuid4()}", server.target, user_id=user)
    model = ScriptedModel([[text("Hello!", "m1")], [text("Avoid peanuts.", "m2")], [text("Noted.", "m3")]])

    def base(ctx: object, agent: object) -> str:  # the SDK's callable form is accepted as the base
        return "You are a careful food assistant."

    agent = Agent(name="food", instructions=memlane_instructions(session, base), model=model)
    await Runner.run(agent, "Hello there", session=session)
    await Runner.run(agent, "Which snacks should I avoid because of my allergy?", session=session)

    first, second = model.sent[0].instructions or "", model.sent[1].instructions or ""
    assert first.startswith("You are a careful food assistant.\n\n")
    assert "What is known about the user:\n- Prefers metric units" in first
    assert "Relevant memories from earlier conversations:" in second and "nut-free snack" in second
    assert "allergic to peanuts" in second  # from the profile, once
    # The conversation is not repeated in the instructions: the SDK sends it as items.
    assert "Hello there" not in second and model.sent[1].input[0] == {
        "role": "user",
        "content": "Hello there",
    }
    assert "Summary of the conversation so far" not in second
    # Recall ran on the turn being answered: the SDK saved it to the session before asking for the
    # instructions (the turn traces record each assembly's query).
    traces = client.list_turn_traces(session_id=session.session_id).traces  # newest first
    assert [t.request.user_input for t in traces] == [
        "Which snacks should I avoid because of my allergy?",
        "Hello there",
    ]

    # A summary of the first exchange (as an agent's own model would submit it) shows up next turn.
    stored = client.list_messages(session_id=session.session_id).messages
    client.submit_summary(
        session_id=session.session_id,
        text="The user greeted the assistant.",
        after_seq=0,
        through_seq=stored[1].seq,
        through_message_id=stored[1].message_id,
    )
    await Runner.run(agent, "Thanks!", session=session)
    third = model.sent[2].instructions or ""
    assert "Summary of the conversation so far (through turn 2):\nThe user greeted the assistant." in third
    assert third.index("What is known") < third.index("Summary of the conversation")
    await session.close()


async def test_instructions_of_a_session_that_does_not_exist_yet_are_the_base(server: SidecarThread) -> None:
    session = MemlaneSession(f"oa-{uuid.uuid4()}", server.target)
    instructions = memlane_instructions(session, "Base only.")
    assert await instructions(None, None) == "Base only."
    await session.close()
