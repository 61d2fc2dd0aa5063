"""Procedures as kept: the model every layer reads (owners, versions, states, and the active version
assembly injects; no proto; enum values match ``memlane.v1`` enums), and below it the Redis store that
holds their JSON form (``ProcedureStore``). The rules are ``service.py``'s; assembly
(``context/sources.py``, ``context/compose.py``) reads the model only."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
from redis.asyncio import Redis

from ..errors import NotFound
from ..infra.redis_lane import as_dict, hot
from ..keyspace import KeySpace


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


# ---------------------------------------------------------------- the store: procedures in Redis
# One HASH of documents (every version) and one HASH of active versions per owner, each a JSON document
# (``encode``). Why Redis and not LanceDB: procedures are few (tens per agent), are never searched by
# similarity (an agent's active procedures are injected whole, every turn), and change by state
# transitions that must be atomic (approve = activate one version and supersede another). A
# compare-and-swap script on the owner's two hashes gives that atomicity in one slot (Redis Cluster
# included), and assembly reads only the small ``active`` hash: one round trip per owner, pipelined.
# Keys are spelled in ``keyspace.py`` (``KeySpace.procedures``). Ids reach Redis only as key parts inside
# hash tags, hash fields and ``ARGV``, never as script text.

# KEYS: docs, active.  ARGV: procedure id, the document read (or "" for none), the new document ("" to
# delete it), its active version ("" for none). Writes only if nobody changed the document since it was
# read; 1 if it wrote.
SWAP = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur or '') ~= ARGV[2] then return 0 end
for i = 1, 2 do
  local value = ARGV[i + 2]
  if value == '' then redis.call('HDEL', KEYS[i], ARGV[1])
  else redis.call('HSET', KEYS[i], ARGV[1], value) end
end
return 1
"""

_SEP = "\0"


class ProcedureStore:
    def __init__(self, redis: Redis, keys: KeySpace) -> None:
        self._redis = redis
        self._keys = keys
        self._swap = redis.register_script(SWAP)

    async def read(self, owner: Owner, procedure_id: str) -> tuple[Procedure | None, bytes]:
        """The procedure and the exact bytes read (the ``expected`` of a later ``swap``)."""
        docs, _ = self._keys.procedures(owner.tag)
        raw: Any = await self._redis.hget(docs, procedure_id)
        if raw is None:
            return None, b""
        return decode(raw), bytes(raw)

    async def swap(self, owner: Owner, procedure_id: str, expected: bytes, new: Procedure | None) -> bool:
        """Writes ``new`` (None deletes) unless the document changed since it was read as ``expected``."""
        docs, active = self._keys.procedures(owner.tag)
        doc, act = (encode(new), encode_active(new)) if new is not None else (b"", b"")
        wrote = int(await self._swap(keys=[docs, active], args=[procedure_id, expected, doc, act]))
        if wrote and new is not None:
            await self._redis.sadd(self._keys.procedure_owners(), owner.tag)
        return bool(wrote)

    async def count(self, owner: Owner) -> int:
        docs, _ = self._keys.procedures(owner.tag)
        return int(await self._redis.hlen(docs))

    async def of_owner(self, owner: Owner) -> list[Procedure]:
        docs, _ = self._keys.procedures(owner.tag)
        raw: Any = await self._redis.hgetall(docs)
        return sorted((decode(v) for v in raw.values()), key=lambda p: p.procedure_id)

    async def owners(self) -> list[Owner]:
        tags: Any = await self._redis.smembers(self._keys.procedure_owners())
        return sorted((Owner.from_tag(t.decode() if isinstance(t, bytes) else t) for t in tags), key=_order)

    async def active(self, owners: Sequence[Owner]) -> list[ActiveProcedure]:
        """The active versions of every procedure of these owners (one pipelined round trip)."""
        if not owners:
            return []
        if len(owners) == 1:  # the common case (an agent in no group): one read on the hot lane
            found: list[Any] = [await hot(self._redis, "HGETALL", self._keys.procedures(owners[0].tag)[1])]
        else:
            async with self._redis.pipeline(transaction=False) as pipe:
                for owner in owners:
                    pipe.hgetall(self._keys.procedures(owner.tag)[1])
                found = await pipe.execute()
        out: list[ActiveProcedure] = []
        for owner, fields in zip(owners, found, strict=True):
            for pid, raw in sorted(as_dict(fields).items()):
                out.append(decode_active(owner, pid.decode() if isinstance(pid, bytes) else pid, raw))
        return out

    # --- per-user provenance (erasure, export)

    async def add_source(self, user_id: str, owner: Owner, procedure_id: str, version: int) -> None:
        member = _SEP.join([owner.tag, procedure_id, str(version)])
        await self._redis.sadd(self._keys.procedure_sources(user_id), member)

    async def sources(self, user_id: str) -> list[tuple[Owner, str, int]]:
        members: Any = await self._redis.smembers(self._keys.procedure_sources(user_id))
        out = []
        for m in members:
            tag, pid, version = (m.decode() if isinstance(m, bytes) else m).split(_SEP)
            out.append((Owner.from_tag(tag), pid, int(version)))
        return sorted(out, key=lambda s: (_order(s[0]), s[1], s[2]))

    async def drop_sources(self, user_id: str) -> None:
        await self._redis.delete(self._keys.procedure_sources(user_id))


def _order(owner: Owner) -> tuple[str, str]:
    return owner.tag, ""


# --- the stored JSON form


def encode(p: Procedure) -> bytes:
    doc: dict[str, Any] = {
        "owner": p.owner.tag,
        "id": p.procedure_id,
        "title": p.title,
        "updated": p.updated_at_ms,
        "versions": [asdict(v) for v in p.versions],
    }
    return orjson.dumps(doc)


def decode(raw: bytes | str) -> Procedure:
    doc = orjson.loads(raw)
    versions = [
        Version(**{**v, "state": State(v["state"]), "kind": Kind(v["kind"]), "origin": Origin(v["origin"])})
        for v in doc["versions"]
    ]
    return Procedure(Owner.from_tag(doc["owner"]), doc["id"], doc["title"], versions, doc["updated"])


def encode_active(p: Procedure) -> bytes:
    """The active version alone, as the owner's ``active`` hash holds it ("" when none)."""
    v = p.active
    if v is None:
        return b""
    return orjson.dumps({"title": p.title, "version": v.version, "kind": int(v.kind), "content": v.content})


def decode_active(owner: Owner, procedure_id: str, raw: bytes | str) -> ActiveProcedure:
    doc = orjson.loads(raw)
    return ActiveProcedure(
        owner, procedure_id, doc["title"], int(doc["version"]), Kind(doc["kind"]), doc["content"]
    )
