"""Dynamic instructions: an agent's own instructions plus what memlane assembled for this turn.

    agent = Agent(name="support", instructions=memlane_instructions(session, "You are a support agent."))

Before each model call the SDK calls the instructions; this one asks memlane for the context of the
session's latest user turn and appends the user's profile, the memories recalled for that turn and the
rolling summary of older turns. The conversation itself is not repeated: the SDK sends it from the
session as input items.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from memlane.v1 import context_pb2 as cpb

from ._session import MemlaneSession

_SECTIONS = (cpb.PROVENANCE_PROFILE, cpb.PROVENANCE_MEMORY, cpb.PROVENANCE_SUMMARY)

Instructions = Callable[[Any, Any], Awaitable[str]]


def render(base: str, blocks: list[cpb.ContextBlock]) -> str:
    """The base instructions followed by the profile, memory and summary blocks' text, in that order."""
    parts = [base] if base else []
    for provenance in _SECTIONS:
        for block in blocks:
            if block.provenance != provenance:
                continue
            parts.extend(m.content for m in block.messages if m.content)  # each carries its heading
    return "\n\n".join(parts)


def memlane_instructions(
    session: MemlaneSession,
    base: str | Callable[[Any, Any], str | Awaitable[str]] = "",
    **options: Any,
) -> Instructions:
    """An ``Agent.instructions`` callable. ``base``: the agent's own instructions (a string or the
    SDK's callable form). ``options``: AssembleContextRequest fields (``model``, ``memory_limit``,
    ``context_window_tokens``...). memlane's configured system prompt is not added: ``base`` is it."""

    async def instructions(run_context: Any, agent: Any) -> str:
        text = base(run_context, agent) if callable(base) else base
        own = text if isinstance(text, str) else await text
        query = await session.last_user_text()
        blocks = await session.assemble(query, system_prompt="", **options)
        return render(own, blocks)

    return instructions
