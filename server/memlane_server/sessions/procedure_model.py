"""Procedures as the domain sees them (no proto, no Redis): owners, versions, states, and the active
version assembly injects. A leaf: the store (``sessions/procedures.py``, which holds their JSON form),
the rules (``procedures/service.py``) and assembly (``context/procedures.py``) all read it. Enum values
match ``memlane.v1`` enums."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..errors import NotFound


class Kind(enum.IntEnum):
    UNSPECIFIED = 0
    ROUTINE = 1
    EXAMPLE = 2
    INSTRUCTION = 3


class State(enum.IntEnum):
    UNSPECIFIED = 0
    PROPOSED = 1
    ACTIVE = 2
    SUPERSEDED = 3  # was active; a newer approved version replaced it
    REJECTED = 4
    ROLLED_BACK = 5  # was active; rolled back


class Origin(enum.IntEnum):
    UNSPECIFIED = 0
    AGENT = 1
    EXTRACTOR = 2
    OPERATOR = 3


# States of versions that were once approved: the only targets a rollback may return to.
ONCE_ACTIVE = frozenset({State.SUPERSEDED, State.ROLLED_BACK})


@dataclass(frozen=True, slots=True)
class Owner:
    """Exactly one of an agent ("" is the unnamed agent of a single-agent app) or a group."""

    agent_id: str = ""
    group: str = ""

    @property
    def tag(self) -> str:
        """The owner inside Redis key hash tags: ``a:<agent>`` or ``g:<group>`` (ids hold no ``{}``)."""
        return f"g:{self.group}" if self.group else f"a:{self.agent_id}"

    @staticmethod
    def from_tag(tag: str) -> Owner:
        kind, _, name = tag.partition(":")
        return Owner(group=name) if kind == "g" else Owner(agent_id=name)


@dataclass(slots=True)
class Version:
    version: int
    state: State
    kind: Kind
    content: str
    origin: Origin
    proposed_by: str
    proposed_at_ms: int
    reason: str = ""
    decided_by: str = ""
    decided_at_ms: int = 0
    note: str = ""
    source_session_id: str = ""
    source_message_ids: list[str] = field(default_factory=list)
    # The user whose session it was learned from ("" = none): erasure and export follow it.
    source_user_id: str = ""


@dataclass(slots=True)
class Procedure:
    owner: Owner
    procedure_id: str
    title: str
    versions: list[Version] = field(default_factory=list)  # oldest first
    updated_at_ms: int = 0

    @property
    def active(self) -> Version | None:
        return next((v for v in self.versions if v.state is State.ACTIVE), None)

    def version(self, number: int) -> Version:
        for v in self.versions:
            if v.version == number:
                return v
        raise NotFound(f"procedure {self.procedure_id!r} has no version {number}")

    @property
    def latest(self) -> int:
        return max((v.version for v in self.versions), default=0)


@dataclass(frozen=True, slots=True)
class ActiveProcedure:
    """What assembly injects: one procedure's active version, with its provenance."""

    owner: Owner
    procedure_id: str
    title: str
    version: int
    kind: Kind
    content: str

    @property
    def agent_id(self) -> str:
        """The owning agent, "" for a group's procedure."""
        return self.owner.agent_id

    @property
    def group(self) -> str:
        return self.owner.group
