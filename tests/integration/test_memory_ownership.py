"""Ownership is part of a memory's identity (issue 41, item 1; merges keep scope, item 6).

Through the real server and client: a row is matched by (user, id), never by id alone, and an id stays
unique in the table whoever holds it. Guards, each with its positive control:

- a snapshot restore never overwrites another user's memory that took an id the restorer once held
  (the breach on 3af1f4b: the victim's memory became the restorer's);
- CreateMemory naming an id another user holds answers exactly as it does for a free id of the
  server's shape (PERMISSION_DENIED, MEMORY_ID_UNAVAILABLE, the same words): no oracle of other
  users' ids (3af1f4b answered ALREADY_EXISTS for a taken id only);
- a merge never folds a private or group item into one with another audience.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import replace
from pathlib import Path

import lancedb
import orjson
import pytest
import redis.asyncio as aioredis
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane.v1 import memory_pb2 as mpb
from memlane_server.errors import PermissionDenied
from memlane_server.keyspace import KeySpace
from memlane_server.ltm import Feedback, MemoryPatch, MemoryScope, MemoryService, NewMemory, Owner, Visibility
from memlane_server.ltm.filters import with_id
from memlane_server.ltm.history import MemoryHistory, item_bytes, item_from_bytes
from memlane_server.ltm.operations import MemorySnapshots
from memlane_server.ltm.redis_state import RedisMemoryHistory
from memlane_server.ltm.schema import TABLE_NAME, to_row
from tests.conftest import delete_prefix
from tests.ltm_fixtures import embedder, memory

__all__ = ["embedder", "memory"]


@pytest.fixture(scope="module")
def api(client: memlane.Client) -> memlane.Client:
    return client


def _user() -> str:
    return f"own-{uuid.uuid4().hex[:8]}"


def _fact(api: memlane.Client, user: str, content: str, memory_id: str = "", **kw: object) -> mpb.Memory:
    return api.create_memory(
        caller=mpb.Caller(user_id=user), content=content, kind=mpb.MEMORY_KIND_FACT, memory_id=memory_id, **kw
    ).memory


def _contents(api: memlane.Client, user: str) -> dict[str, tuple[str, str]]:
    flt = mpb.MemoryFilter(include_retired=True)
    items = api.list_memories(caller=mpb.Caller(user_id=user), filter=flt, page_size=500).memories
    return {m.memory_id: (m.user_id, m.content) for m in items}


def test_a_restore_never_takes_another_users_memory(api: memlane.Client) -> None:
    """B holds id X, snapshots, deletes X; the victim V then creates a memory with the free id X; B's
    restore must leave V's memory V's, with V's text, and skip X (absent from the restore's answer).
    Positive control: the same restore brings back B's own deleted item and undoes B's own change."""
    attacker, victim = _user(), _user()
    shared_id = f"chosen-{uuid.uuid4().hex[:8]}"
    b = mpb.Caller(user_id=attacker)
    _fact(api, attacker, "The attacker likes chess.", memory_id=shared_id)
    pet = _fact(api, attacker, "The attacker has a cat named Tom.")
    city = _fact(api, attacker, "The attacker lives in Oslo.")
    api.create_memory_snapshot(caller=b, snapshot_id="trap")
    for mid in (shared_id, pet.memory_id):
        api.delete_memory(caller=b, memory_id=mid)
    api.update_memory(
        caller=b,
        memory=mpb.Memory(memory_id=city.memory_id, content="The attacker lives in Bergen."),
        update_mask=FieldMask(paths=["content"]),
    )
    _fact(api, victim, "The victim's locker code is behind the poster.", memory_id=shared_id)

    restored = api.restore_memory_snapshot(caller=b, snapshot_id="trap").diffs

    assert _contents(api, victim) == {shared_id: (victim, "The victim's locker code is behind the poster.")}
    assert shared_id not in _contents(api, attacker)
    assert shared_id not in {d.memory_id for d in restored}
    with pytest.raises(memlane.NotFoundError):
        api.get_memory(caller=b, memory_id=shared_id)
    # Positive control: everything else of the attacker's own snapshot came back.
    mine = _contents(api, attacker)
    assert mine[pet.memory_id] == (attacker, "The attacker has a cat named Tom.")
    assert mine[city.memory_id] == (attacker, "The attacker lives in Oslo.")
    assert {d.memory_id for d in restored} == {pet.memory_id, city.memory_id}


def _refusal(api: memlane.Client, user: str, memory_id: str) -> memlane.PermissionDeniedError:
    with pytest.raises(memlane.PermissionDeniedError) as err:
        _fact(api, user, "The user collects stamps.", memory_id=memory_id)
    return err.value


def test_an_id_another_user_holds_is_refused_like_a_free_one(api: memlane.Client) -> None:
    """The answer to an id another user holds is the answer to a free id of the server's shape: same
    code, reason, field and words (but the id itself), so it does not tell whether the id is held.
    Positive controls: the caller's own retry is idempotent, its own id with other text is
    ALREADY_EXISTS, a free id of its own choosing is stored, and the holder's memory is untouched."""
    holder, prober = _user(), _user()
    held = f"chosen-{uuid.uuid4().hex[:8]}"
    server_held = _fact(api, holder, "The holder plays the oboe.").memory_id  # an id the server chose
    _fact(api, holder, "The holder sails on Sundays.", memory_id=held)
    free_server_shaped = "mem_" + secrets.token_hex(14)

    taken = _refusal(api, prober, held)
    taken_server = _refusal(api, prober, server_held)
    free = _refusal(api, prober, free_server_shaped)
    assert _shape(taken, held) == _shape(free, free_server_shaped) == _shape(taken_server, server_held)
    assert taken.reason == "MEMORY_ID_UNAVAILABLE" and taken.field == "memory_id"
    assert holder not in taken.message and "holds" not in taken.message
    assert _contents(api, prober) == {}  # nothing written for the prober
    assert _contents(api, holder)[held] == (holder, "The holder sails on Sundays.")

    # Positive controls: the documented behaviour of a caller's own ids.
    own = f"chosen-{uuid.uuid4().hex[:8]}"
    first = api.create_memory(
        caller=mpb.Caller(user_id=prober), content="The user collects stamps.", kind=mpb.MEMORY_KIND_FACT,
        memory_id=own,
    )  # fmt: skip
    again = api.create_memory(
        caller=mpb.Caller(user_id=prober), content="The user collects stamps.", kind=mpb.MEMORY_KIND_FACT,
        memory_id=own,
    )  # fmt: skip
    assert first.memory.memory_id == again.memory.memory_id == own
    assert again.outcome == mpb.INGEST_OUTCOME_CREATED
    with pytest.raises(memlane.AlreadyExistsError):
        _fact(api, prober, "The user collects coins.", memory_id=own)
    # The server's own ids stay the caller's to retry with.
    minted = _fact(api, prober, "The user bakes bread.")
    assert (
        _fact(api, prober, "The user bakes bread.", memory_id=minted.memory_id).memory_id == minted.memory_id
    )


def _shape(err: memlane.MemlaneError, memory_id: str) -> tuple[object, str, str, str]:
    return err.code, err.reason, err.field, err.message.replace(repr(memory_id), "<id>")


def test_a_merge_keeps_each_items_audience(api: memlane.Client) -> None:
    """Merging an agent-private or a group item into a user-wide one is INVALID_ARGUMENT naming the
    item's field, and changes nothing: its keywords would reach every agent of the user. Positive
    control: two user-wide items merge, the kept one taking the other's keywords."""
    user = _user()
    agent = mpb.Caller(user_id=user, agent_id="agent-a", groups=["ops"])
    wide = api.create_memory(
        caller=agent, content="The user drinks coffee.", kind=mpb.MEMORY_KIND_FACT, keywords=["coffee"]
    ).memory
    private = api.create_memory(
        caller=agent, content="The user drinks espresso at night.", kind=mpb.MEMORY_KIND_FACT,
        keywords=["insomnia-private"], scope=mpb.MEMORY_SCOPE_AGENT,
    ).memory  # fmt: skip
    grouped = api.create_memory(
        caller=agent, content="The user drinks coffee before standups.", kind=mpb.MEMORY_KIND_FACT,
        keywords=["ops-only"], scope=mpb.MEMORY_SCOPE_GROUP, group="ops",
    ).memory  # fmt: skip
    for other in (private, grouped):
        with pytest.raises(memlane.InvalidArgumentError) as err:
            api.merge_memories(caller=agent, memory_ids=[wide.memory_id, other.memory_id])
        assert err.value.field == "memory_ids[1]"
        assert "audience" in err.value.message
    with pytest.raises(memlane.InvalidArgumentError):  # nor the other way round
        api.merge_memories(caller=agent, memory_ids=[private.memory_id, wide.memory_id])
    now = api.get_memory(caller=agent, memory_id=wide.memory_id).memory
    assert list(now.keywords) == ["coffee"] and not now.superseded_by
    for other in (private, grouped):
        assert not api.get_memory(caller=agent, memory_id=other.memory_id).memory.superseded_by

    # Positive control: the same audience merges.
    also_wide = api.create_memory(
        caller=agent, content="The user takes coffee black.", kind=mpb.MEMORY_KIND_FACT, keywords=["black"]
    ).memory
    merged = api.merge_memories(caller=agent, memory_ids=[wide.memory_id, also_wide.memory_id])
    assert merged.memory.memory_id == wide.memory_id
    assert set(merged.memory.keywords) == {"coffee", "black"}
    assert list(merged.superseded_ids) == [also_wide.memory_id]


# --- The store itself: a write matches (user, id), whoever else holds the id.

V = Owner("victim", "agent-a")
B = Owner("other", "agent-a")


async def _rows(memory: MemoryService, memory_id: str) -> list[tuple[str, str]]:
    """Every row of the id, whoever holds it: (user, content)."""
    rows = await memory.store.fetch(with_id(memory_id))
    return sorted((r.user_id, r.content) for r in rows)


async def test_store_writes_never_touch_another_users_row(memory: MemoryService, tmp_path: Path) -> None:
    """``upsert`` and ``add`` naming an id another user holds are refused with the one answer, nothing
    written; ``held_by_others`` names such ids for a batch. A duplicate row of one id (a table written
    before ownership was enforced, e.g. by an import on 3af1f4b) stays each user's own: update,
    feedback, upsert and delete by one user never reach the other's row. Positive controls: the
    holder's own upsert and a free id's add are written."""
    await memory.create(V, NewMemory("fact", "The victim keeps bees.", memory_id="shared-x"))
    theirs = (await memory.store.fetch(with_id("shared-x"), with_vector=True))[0]
    forged = replace(theirs, user_id=B.user_id, content="Overwritten by another user.")
    for write in (memory.store.upsert, memory.store.add):
        with pytest.raises(PermissionDenied) as err:
            await write([forged])
        assert err.value.reason == "MEMORY_ID_UNAVAILABLE"
        assert await _rows(memory, "shared-x") == [("victim", "The victim keeps bees.")]
    assert await memory.store.held_by_others(B.user_id, ["shared-x", "free-1"]) == {"shared-x"}
    assert await memory.store.held_by_others(V.user_id, ["shared-x"]) == set()
    with pytest.raises(PermissionDenied):  # the service's own create, strict: the same answer
        await memory.create(B, NewMemory("fact", "The other keeps wasps.", memory_id="shared-x"))
    # Positive controls.
    await memory.store.upsert([replace(theirs, content="The victim keeps two hives.")])
    await memory.store.add([replace(forged, id="free-1")])
    assert await _rows(memory, "shared-x") == [("victim", "The victim keeps two hives.")]
    assert await _rows(memory, "free-1") == [("other", "Overwritten by another user.")]

    # A duplicate of one id from before: written straight into the table, as an older version did.
    db = await lancedb.connect_async(str(tmp_path / "ltm"))
    table = await db.open_table(TABLE_NAME)
    await table.add([to_row(replace(forged, content="The other keeps wasps."))])
    await memory.store.refresh()
    mine = Visibility(B.user_id, B.agent_id)
    await memory.update(mine, "shared-x", MemoryPatch(content="The other keeps hornets."))
    await memory.feedback(mine, "shared-x", Feedback.USEFUL)
    own = await memory.get(mine, "shared-x")
    assert own.useful_count == 1 and own.content == "The other keeps hornets."
    await memory.store.upsert([replace(own, vector=theirs.vector, importance=0.9)])
    assert await _rows(memory, "shared-x") == [
        ("other", "The other keeps hornets."),
        ("victim", "The victim keeps two hives."),
    ]
    victim = await memory.get(Visibility(V.user_id, V.agent_id), "shared-x")
    assert victim.useful_count == 0 and victim.importance == theirs.importance
    await memory.delete(mine, "shared-x")
    assert await _rows(memory, "shared-x") == [("victim", "The victim keeps two hives.")]
    db.close()


async def test_a_restore_writes_only_the_restorers_rows(memory: MemoryService, redis_url: str) -> None:
    """A snapshot holding items that are not the restorer's to write (what an import file could put
    there: an item naming another user's id, another user's item, another agent's private item) is
    restored without them: they are skipped, absent from the answer, and no row of them is written.
    Positive control: the restorer's own deleted item comes back from the same snapshot."""
    prefix = f"own-{uuid.uuid4().hex[:8]}"
    redis = aioredis.from_url(redis_url)
    backend = RedisMemoryHistory(redis, KeySpace(prefix), max_versions=100, max_snapshots=5)
    snaps = MemorySnapshots(memory, backend, MemoryHistory(backend))
    try:
        await memory.create(V, NewMemory("fact", "The victim keeps bees.", memory_id="victim-x"))
        await memory.create(V, NewMemory("fact", "The victim likes figs.", memory_id="victim-y"))
        await memory.create(B, NewMemory("fact", "The other keeps wasps.", memory_id="own-1"))
        restorer = Visibility(B.user_id, B.agent_id)
        await snaps.take(restorer, "honest")
        own = item_from_bytes((await backend.items(B.user_id, "honest"))["own-1"])
        poison = {
            "victim-x": replace(own, id="victim-x", content="Taken over."),  # B's item, V's id
            "victim-y": replace(own, id="victim-y", user_id=V.user_id, content="Rewritten."),  # V's own
            "private-z": replace(own, id="private-z", scope=MemoryScope.AGENT, agent_id="agent-z"),
        }
        meta = orjson.loads((await backend.meta(B.user_id, "honest")) or b"{}")
        await backend.reserve(B.user_id, "forged", meta["created_at_ms"])
        docs = {"own-1": item_bytes(own), **{k: item_bytes(v) for k, v in poison.items()}}
        await backend.write(B.user_id, "forged", orjson.dumps({**meta, "snapshot_id": "forged"}), docs)
        await memory.delete(restorer, "own-1")

        undone = await snaps.restore(restorer, "forged")

        assert [d.memory_id for d in undone] == ["own-1"]
        assert await _rows(memory, "victim-x") == [("victim", "The victim keeps bees.")]
        assert await _rows(memory, "victim-y") == [("victim", "The victim likes figs.")]
        assert await _rows(memory, "private-z") == []
        assert await _rows(memory, "own-1") == [("other", "The other keeps wasps.")]  # positive control
    finally:
        await redis.aclose()
        delete_prefix(redis_url, prefix)
