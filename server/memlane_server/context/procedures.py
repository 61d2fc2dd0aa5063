"""Procedures as one more gathered input of assembly: what it needs from procedural memory (a protocol;
the app wires ``procedures.ProcedureService`` in) and the pure block builder.

Only active (approved) versions ever reach here, of the viewer's own agent and of its groups: the
source is asked for exactly those owners, so another agent's procedure cannot reach this context.
The block sits in the system section, after the system prompt, and shares its grant, within its own
cap (``context_procedures_max_tokens``); whole procedures only, most binding kinds first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from ..procedures.store import ActiveProcedure, Kind
from ..sessions.model import Role
from .compose import Costing
from .model import Block, BlockMessage, ProcedureRef, Provenance

PROCEDURES_HEADING = "How to work (procedures approved for this agent):"
# Kinds by how binding they are: instructions, routines, examples.
_KIND_ORDER = {Kind.INSTRUCTION: 0, Kind.ROUTINE: 1, Kind.EXAMPLE: 2}


# What a source returns: one procedure's active version (the name assembly's modules use for it).
ProcedureText = ActiveProcedure


class ProcedureSource(Protocol):
    async def for_agent(self, agent_id: str, groups: Sequence[str]) -> list[ProcedureText]:
        """Active procedures of this agent and of these groups, nobody else's."""
        ...


class NoProcedures:
    async def for_agent(self, agent_id: str, groups: Sequence[str]) -> list[ProcedureText]:
        return []


class ProcedureBlocks:
    """Built blocks by (model, limit, the exact versions): a version's text never changes, and an agent's
    procedures change rarely, so most assemblies reuse the block instead of tokenizing it again."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._built: OrderedDict[tuple[object, ...], Block] = OrderedDict()

    def clear(self) -> None:
        self._built.clear()

    def block(self, costing: Costing, items: Sequence[ProcedureText], limit: int) -> Block:
        key = (costing.model, limit, tuple((p.agent_id, p.group, p.procedure_id, p.version) for p in items))
        built = self._built.get(key)
        if built is None:
            built = self._built[key] = procedures_block(costing, items, limit)
            while len(self._built) > self._size:
                self._built.popitem(last=False)
        else:
            self._built.move_to_end(key)
        # A copy: assembly sets rendered_text on the block it sends.
        return replace(built, messages=list(built.messages), procedures=list(built.procedures))


def procedures_block(costing: Costing, items: Sequence[ProcedureText], limit: int) -> Block:
    """One system message holding as many whole procedures as fit ``limit`` (a shorter one may still fit
    after a longer one did not), with their refs as provenance."""
    block = Block(Provenance.PROCEDURE, cap_tokens=limit)
    ordered = sorted(items, key=lambda p: (_KIND_ORDER.get(p.kind, 9), p.group != "", p.procedure_id))
    parts = [PROCEDURES_HEADING]
    chosen: list[ProcedureText] = []
    running = costing.message(PROCEDURES_HEADING)
    for p in ordered:
        text = f"\n\n## {p.title} (v{p.version})\n{p.content}"
        cost = costing.text(text)
        if running + cost > limit:
            block.truncated = True
            continue
        running += cost
        parts.append(text)
        chosen.append(p)
    while chosen:
        content = "".join(parts)
        cost = costing.message(content)
        if cost <= limit:
            block.messages.append(BlockMessage(Role.SYSTEM, content))
            block.procedures = [ProcedureRef(p.agent_id, p.group, p.procedure_id, p.version) for p in chosen]
            block.token_count = cost
            return block
        chosen.pop()  # per-part costs are additive to within a token or two: drop the last until it fits
        parts.pop()
        block.truncated = True
    return block
