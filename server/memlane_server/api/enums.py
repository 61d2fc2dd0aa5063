"""Domain enums <-> their ``memlane.v1`` twins: one checked bridge each.

A domain member pairs with the proto value named ``<ENUM_NAME>_<MEMBER>`` (``Role.USER`` with
``ROLE_USER``), and a bridge refuses to build unless the two carry the same number, every domain
member has its twin and every proto value but the zero one (``*_UNSPECIFIED``) has a member: a value
added on one side only fails at import, not on the wire (``tests/unit/api/test_enum_bridges.py``).

String enums (``MemoryKind``, ``MemoryScope``: their values are what LanceDB stores) have no number
to agree on; they pair by name alone, held to the same both-ways rule (``NAMED_BRIDGES``).
"""

from __future__ import annotations

import enum
import re
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from memlane.v1 import context_pb2 as cpb
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import procedure_pb2 as ppb
from memlane.v1 import session_pb2 as pb
from memlane.v1 import session_service_pb2 as spb

from ..context import Fallback, Provenance, Section, Strategy
from ..errors import InvalidArgument
from ..ltm.history import ChangeReason
from ..ltm.model import IngestOutcome
from ..ltm.operations import DiffKind
from ..memory_kinds import MemoryKind, MemoryScope
from ..procedures.store import Kind, Origin, State
from ..sessions.events import EventType
from ..sessions.model import PromotionState, Role, SessionStatus, Topology, VisibilityKind

if TYPE_CHECKING:
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

E = TypeVar("E", bound=enum.Enum)
V = TypeVar("V", bound=int)


class EnumBridge(Generic[E, V]):
    def __init__(self, domain: type[E], proto: _EnumTypeWrapper[V]) -> None:
        self.domain = domain
        self.proto_name = proto.DESCRIPTOR.full_name
        prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", proto.DESCRIPTOR.name).upper() + "_"
        names = dict(proto.items())
        self._to_pb: dict[E, V] = {}
        for member in domain:
            value = names.get(prefix + member.name)
            # An int enum must also carry the proto's number; a string enum pairs by name alone.
            if value is None or (isinstance(member, int) and int(value) != int(member)):
                raise TypeError(f"{domain.__name__}.{member.name} has no twin in {self.proto_name}")
            self._to_pb[member] = value
        self._from_pb: dict[int, E] = {int(v): m for m, v in self._to_pb.items()}
        missing = [n for n, v in names.items() if int(v) and int(v) not in self._from_pb]
        if missing:
            raise TypeError(f"{self.proto_name} values {missing} have no member in {domain.__name__}")

    def to_pb(self, member: E) -> V:
        return self._to_pb[member]

    def from_pb(self, value: int) -> E | None:
        """The member of a value read from a request; None for one the domain does not know."""
        return self._from_pb.get(int(value))

    def parse(self, value: int, field: str) -> E:
        """``from_pb``, refusing an unknown value as the caller's error."""
        member = self.from_pb(value)
        if member is None:
            raise InvalidArgument(f"{field} {value} is not a known value")
        return member


ROLE = EnumBridge(Role, pb.Role)
SESSION_STATUS = EnumBridge(SessionStatus, pb.SessionStatus)
PROMOTION_STATE = EnumBridge(PromotionState, pb.PromotionState)
VISIBILITY = EnumBridge(VisibilityKind, pb.VisibilityKind)
TOPOLOGY = EnumBridge(Topology, pb.Topology)
EVENT_TYPE = EnumBridge(EventType, spb.SessionEventType)
PROCEDURE_KIND = EnumBridge(Kind, ppb.ProcedureKind)
PROCEDURE_STATE = EnumBridge(State, ppb.ProcedureState)
PROCEDURE_ORIGIN = EnumBridge(Origin, ppb.ProcedureOrigin)
CHANGE_REASON = EnumBridge(ChangeReason, mpb.MemoryChangeReason)
DIFF_KIND = EnumBridge(DiffKind, mpb.MemoryDiffKind)
PROVENANCE = EnumBridge(Provenance, cpb.Provenance)
SECTION = EnumBridge(Section, cpb.ContextSection)
STRATEGY = EnumBridge(Strategy, cpb.ContextStrategy)
FALLBACK = EnumBridge(Fallback, cpb.HistoryFallback)
MEMORY_KIND = EnumBridge(MemoryKind, mpb.MemoryKind)
MEMORY_SCOPE = EnumBridge(MemoryScope, mpb.MemoryScope)
INGEST_OUTCOME = EnumBridge(IngestOutcome, mpb.IngestOutcome)

# Every bridge of an int enum, for the test that holds each to both directions and to the numbers.
BRIDGES: tuple[EnumBridge[Any, Any], ...] = (
    ROLE,
    SESSION_STATUS,
    PROMOTION_STATE,
    VISIBILITY,
    TOPOLOGY,
    EVENT_TYPE,
    PROCEDURE_KIND,
    PROCEDURE_STATE,
    PROCEDURE_ORIGIN,
    CHANGE_REASON,
    DIFF_KIND,
    PROVENANCE,
    SECTION,
    STRATEGY,
    FALLBACK,
)

# Every bridge of a string enum (paired by name), for the same test without the numbers.
NAMED_BRIDGES: tuple[EnumBridge[Any, Any], ...] = (MEMORY_KIND, MEMORY_SCOPE, INGEST_OUTCOME)
