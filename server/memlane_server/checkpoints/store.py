"""Framework state per session: opaque, versioned checkpoints (LangGraph's checkpointer contract).

Everything lives under the session's own hash tag (``KeySpace.checkpoints``), so one Lua script reads
or changes a thread atomically, on Redis Cluster too, and erasure of the session takes it along.
Checkpoint ids sort by time (LangGraph uses uuid6), so a lexically ordered ZSET of
``namespace\\0checkpoint_id`` members gives "newest of a namespace" in one range read. Channel values
are stored once per (namespace, channel, version), as LangGraph's own savers do, so a step that
changes one channel writes one value, not the whole state.

Cost: a put is one EVALSHA; a get (checkpoint, its values and pending writes) is one EVALSHA.

The records of export and the archive, and the archiver that moves the state out at retirement and
back at resumption, close the module: they are the same state's edges.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import orjson
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript as Script
from redis.exceptions import NoScriptError, ResponseError

from ..errors import InvalidArgument
from ..ids import check_id
from ..keyspace import KeySpace
from ..paging import decode_token, encode_token, page_size, query_fingerprint
from ..sessions.messages import now_ms
from ..sessions.model import Session
from ..sessions.scripts import script_error
from . import scripts

MAX_NAME = 1024  # characters of a namespace, checkpoint, task or channel name
MAX_METADATA_BYTES = 64 * 1024
_SEP = "\x00"


@dataclass(slots=True)
class Typed:
    type: str
    data: bytes


@dataclass(slots=True)
class Write:
    task_id: str
    index: int
    channel: str
    value: Typed
    task_path: str = ""


@dataclass(slots=True)
class Checkpoint:
    session_id: str
    namespace: str
    checkpoint_id: str
    parent_checkpoint_id: str
    checkpoint: Typed
    metadata_json: str
    channel_versions: dict[str, str]
    channel_values: list[tuple[str, str, Typed]] = field(default_factory=list)  # channel, version, value
    writes: list[Write] = field(default_factory=list)
    created_at_ms: int = 0


def check_name(value: str, name: str, *, required: bool = True) -> None:
    """Namespaces, ids, tasks and channels are free text, but never contain NUL (the key separator)."""
    if required and not value:
        raise InvalidArgument(f"{name} is required")
    if len(value) > MAX_NAME:
        raise InvalidArgument(f"{name} is longer than {MAX_NAME} characters")
    if _SEP in value:
        raise InvalidArgument(f"{name} must not contain NUL characters")


def _metadata(raw: str, name: str) -> dict[str, Any]:
    if len(raw) > MAX_METADATA_BYTES:
        raise InvalidArgument(f"{name} is larger than {MAX_METADATA_BYTES} bytes")
    if not raw:
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidArgument(f"{name} is not valid JSON") from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{name} must be a JSON object")
    return value


def _typed(raw: bytes) -> Typed:
    kind, _, data = raw.partition(b"\x00")
    return Typed(kind.decode(), data)


def _pack_typed(t: Typed) -> bytes:
    return t.type.encode() + b"\x00" + t.data


class ThreadRetired(Exception):
    """The session's hot data is in the archive: resume it (``Resumer.ensure_hot``) and retry."""


class CheckpointStore:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace) -> None:
        self._redis = redis
        self._keys = keys
        # redis-py's Script wrapper costs more than the round trip; send EVALSHA bare (as appends do).
        self._command = cast(Callable[..., Awaitable[Any]], redis.execute_command)
        self._put = redis.register_script(scripts.CK_PUT)
        self._put_writes = redis.register_script(scripts.CK_PUT_WRITES)
        self._read = redis.register_script(scripts.CK_READ)
        self._drop = redis.register_script(scripts.CK_DROP)
        self._clear = redis.register_script(scripts.CK_CLEAR)

    async def _eval(self, script: Script, session_id: str, keys: list[str], args: list[Any]) -> Any:
        try:
            try:
                return await self._command("EVALSHA", script.sha, len(keys), *keys, *args)
            except NoScriptError:  # a fresh or restarted Redis: nothing ran the first time
                await self._redis.script_load(script.script)
                return await self._command("EVALSHA", script.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            if str(exc).startswith("RETIRED"):
                raise ThreadRetired(session_id) from exc
            raise script_error(exc, session_id) from exc

    # ------------------------------------------------------------------------------------- writes

    async def put(
        self, cp: Checkpoint, new_values: Sequence[tuple[str, str, Typed]], *, restoring: bool = False
    ) -> None:
        check_id(cp.session_id, "session_id")
        check_name(cp.namespace, "namespace", required=False)
        check_name(cp.checkpoint_id, "checkpoint_id")
        check_name(cp.parent_checkpoint_id, "parent_checkpoint_id", required=False)
        check_name(cp.checkpoint.type, "checkpoint.type", required=False)
        metadata = _metadata(cp.metadata_json, "metadata_json")
        run_id = metadata.get("run_id")
        versions: list[str] = []
        for ch, ver in cp.channel_versions.items():
            check_name(ch, "channel_versions key")
            check_name(ver, f"channel_versions[{ch!r}]")
            versions += [ch, ver]
        blobs: list[Any] = []
        for i, (ch, ver, value) in enumerate(new_values):
            check_name(ch, f"new_values[{i}].channel")
            check_name(ver, f"new_values[{i}].version")
            check_name(value.type, f"new_values[{i}].value.type", required=False)
            blobs += [_SEP.join((cp.namespace, ch, ver)), _pack_typed(value)]
        head = _SEP.join((cp.parent_checkpoint_id, str(now_ms()), cp.checkpoint.type, cp.metadata_json))
        record = head.encode() + b"\x00" + cp.checkpoint.data
        k = self._keys.checkpoints(cp.session_id)
        run = str(run_id) if isinstance(run_id, str | int) and not isinstance(run_id, bool) else ""
        await self._eval(
            self._put,
            cp.session_id,
            [self._keys.session(cp.session_id).doc, k.index, k.data, k.versions, k.blobs, k.runs],
            [
                _member(cp.namespace, cp.checkpoint_id),
                record,
                _SEP.join(versions),
                run,
                int(restoring),
                *blobs,
            ],
        )
        if run:
            await self._redis.sadd(self._keys.checkpoint_run(run), cp.session_id)

    async def put_writes(
        self,
        session_id: str,
        namespace: str,
        checkpoint_id: str,
        writes: list[Write],
        *,
        restoring: bool = False,
    ) -> int:
        check_id(session_id, "session_id")
        check_name(namespace, "namespace", required=False)
        check_name(checkpoint_id, "checkpoint_id")
        args: list[Any] = [int(restoring)]
        base = _member(namespace, checkpoint_id)
        for i, w in enumerate(writes):
            check_name(w.task_id, f"writes[{i}].task_id")
            check_name(w.channel, f"writes[{i}].channel")
            check_name(w.task_path, f"writes[{i}].task_path", required=False)
            check_name(w.value.type, f"writes[{i}].value.type", required=False)
            head = _SEP.join((w.task_id, str(w.index), w.channel, w.task_path, w.value.type))
            args += [
                _SEP.join((base, w.task_id, str(w.index))),
                head.encode() + b"\x00" + w.value.data,
                int(w.index < 0),
            ]
        if not writes:
            return 0
        k = self._keys.checkpoints(session_id)
        doc = self._keys.session(session_id).doc
        return int(await self._eval(self._put_writes, session_id, [doc, k.write_index, k.writes], args))

    # ------------------------------------------------------------------------------------- reads

    async def get(self, session_id: str, namespace: str, checkpoint_id: str) -> Checkpoint | None:
        """The checkpoint, or the newest of the namespace when ``checkpoint_id`` is empty."""
        check_id(session_id, "session_id")
        check_name(namespace, "namespace", required=False)
        check_name(checkpoint_id, "checkpoint_id", required=False)
        if checkpoint_id:
            exact = b"[" + _member(namespace, checkpoint_id).encode()
            rows = await self._read_rows(session_id, exact, exact, 1, reverse=False)
        else:
            lo, hi = _ns_bounds(namespace)
            rows = await self._read_rows(session_id, lo, hi, 1, reverse=True)
        return rows[0] if rows else None

    async def list_page(
        self,
        session_id: str,
        namespace: str | None,
        *,
        before: str = "",
        metadata_filter_json: str = "",
        size: int = 0,
        token: str = "",
    ) -> tuple[list[Checkpoint], str]:
        """Newest first (within a namespace; namespace by namespace when ``namespace`` is None)."""
        check_id(session_id, "session_id")
        if namespace is not None:
            check_name(namespace, "namespace", required=False)
        check_name(before, "before_checkpoint_id", required=False)
        wanted = _metadata(metadata_filter_json, "metadata_filter_json")
        size = page_size(size)
        q = query_fingerprint("checkpoints", session_id, namespace, before, metadata_filter_json)
        cursor = decode_token(token, q)
        lo, hi = _ns_bounds(namespace) if namespace is not None else (b"-", b"+")
        if cursor is not None:
            if not cursor or not isinstance(cursor[0], str):
                raise InvalidArgument("page_token is malformed; start again without it")
            hi = b"(" + cursor[0].encode()
        elif before and namespace is not None:
            hi = b"(" + _member(namespace, before).encode()
        out: list[Checkpoint] = []
        last = ""
        while len(out) < size:
            chunk = max(size * 2, 32) if wanted or (before and namespace is None) else size
            rows = await self._read_rows(session_id, lo, hi, chunk, reverse=True)
            for cp in rows:
                last = _member(cp.namespace, cp.checkpoint_id)
                if before and namespace is None and cp.checkpoint_id >= before:
                    continue
                if all(_json_equal(_metadata(cp.metadata_json, "metadata"), wanted)):
                    out.append(cp)
                    if len(out) == size:
                        break
            if len(rows) < chunk:
                return out, ""
            hi = b"(" + last.encode()
        return out, encode_token(q, [last])

    async def _read_rows(
        self, session_id: str, lo: bytes, hi: bytes, count: int, *, reverse: bool
    ) -> list[Checkpoint]:
        k = self._keys.checkpoints(session_id)
        keys = [
            k.index,
            k.data,
            k.versions,
            k.blobs,
            k.write_index,
            k.writes,
            self._keys.session(session_id).doc,
        ]
        raw = cast(
            list[list[Any]], await self._eval(self._read, session_id, keys, [lo, hi, count, int(reverse)])
        )
        return [_decode(session_id, *row) for row in raw]

    async def dump(self, session_id: str) -> list[Checkpoint]:
        """Every checkpoint of a session with its values and writes, oldest first (copy, export)."""
        check_id(session_id, "session_id")
        out: list[Checkpoint] = []
        lo = b"-"
        while True:
            rows = await self._read_rows(session_id, lo, b"+", 200, reverse=False)
            out += rows
            if len(rows) < 200:
                return out
            lo = b"(" + _member(rows[-1].namespace, rows[-1].checkpoint_id).encode()

    # ------------------------------------------------------------------------------------- deletes

    async def delete_thread(self, session_id: str) -> int:
        check_id(session_id, "session_id")
        runs = cast(list[bytes], await self._redis.hvals(self._keys.checkpoints(session_id).runs))
        deleted = await self.clear(session_id)
        for run in set(runs):
            await self._redis.srem(self._keys.checkpoint_run(run.decode()), session_id)
        return deleted

    async def clear(self, session_id: str, expected_generation: int | None = None) -> int:
        """Deletes the session's state; with ``expected_generation``, only if nothing changed since that
        generation was read (returns -1 then). Run-index entries are left to ``delete_thread``: a
        retired session's entries stay and find it again once it is resumed."""
        k = self._keys.checkpoints(session_id)
        gen = "" if expected_generation is None else str(expected_generation)
        return int(await self._clear(keys=[self._keys.session(session_id).doc, *k.all()], args=[gen]))

    async def generation(self, session_id: str) -> int:
        """Bumped by every change of the session's checkpoints (the retirement guard)."""
        raw = await self._redis.hget(self._keys.session(session_id).doc, "ck_gen")
        return int(raw or 0)

    async def prune(self, session_ids: Sequence[str], keep_latest: bool) -> int:
        dropped = 0
        for i, sid in enumerate(session_ids):
            check_id(sid, f"session_ids[{i}]")
        for sid in session_ids:
            if keep_latest:
                dropped += await self._drop_where(sid, ["latest"])
            else:
                dropped += await self.delete_thread(sid)
        return dropped

    async def run_sessions(self, run_ids: Sequence[str]) -> list[str]:
        """The sessions holding checkpoints of any of these runs (whoever may delete them is checked)."""
        for i, run in enumerate(run_ids):
            check_name(run, f"run_ids[{i}]")
        out: set[str] = set()
        for run in run_ids:
            out |= {
                s.decode()
                for s in cast(list[bytes], await self._redis.smembers(self._keys.checkpoint_run(run)))
            }
        return sorted(out)

    async def delete_runs(self, run_ids: Sequence[str]) -> int:
        for i, run in enumerate(run_ids):
            check_name(run, f"run_ids[{i}]")
        dropped = 0
        for run in run_ids:
            key = self._keys.checkpoint_run(run)
            sids = cast(list[bytes], await self._redis.smembers(key))
            for sid in sids:
                dropped += await self._drop_where(sid.decode(), ["runs", run])
            await self._redis.delete(key)
        return dropped

    async def _drop_where(self, session_id: str, args: list[str]) -> int:
        k = self._keys.checkpoints(session_id)
        return int(
            await self._drop(
                keys=[
                    k.index,
                    k.data,
                    k.versions,
                    k.blobs,
                    k.runs,
                    k.write_index,
                    k.writes,
                    self._keys.session(session_id).doc,
                ],
                args=args,
            )
        )

    async def copy(self, source: str, target: str) -> int:
        """Copies every checkpoint, value and write of ``source`` into ``target`` (which must exist)."""
        rows = await self.dump(source)
        for cp in rows:
            cp.session_id = target
            await self.put(cp, cp.channel_values)
            if cp.writes:
                await self.put_writes(target, cp.namespace, cp.checkpoint_id, cp.writes)
        return len(rows)

    async def forget_runs_of(self, session_ids: Sequence[str]) -> None:
        """Erasure: takes the sessions out of the per-run index (their keys go with the session's)."""
        for sid in session_ids:
            runs = cast(list[bytes], await self._redis.hvals(self._keys.checkpoints(sid).runs))
            for run in set(runs):
                await self._redis.srem(self._keys.checkpoint_run(run.decode()), sid)


def _member(namespace: str, checkpoint_id: str) -> str:
    return namespace + _SEP + checkpoint_id


def _ns_bounds(namespace: str) -> tuple[bytes, bytes]:
    """Lexical bounds of one namespace's members (UTF-8 never contains the byte 0xFF)."""
    prefix = (namespace + _SEP).encode()
    return b"[" + prefix, b"(" + prefix + b"\xff"


def _json_equal(have: dict[str, Any], wanted: dict[str, Any]) -> list[bool]:
    return [k in have and have[k] == v for k, v in wanted.items()]


def _decode(
    session_id: str, member: bytes, record: bytes, blobs: list[bytes], writes: list[bytes]
) -> Checkpoint:
    namespace, _, checkpoint_id = member.decode().partition(_SEP)
    parent, created, kind, metadata_json, data = record.split(b"\x00", 4)
    versions: dict[str, str] = {}
    values: list[tuple[str, str, Typed]] = []
    for i in range(0, len(blobs), 3):
        ch, ver = blobs[i].decode(), blobs[i + 1].decode()
        versions[ch] = ver
        values.append((ch, ver, _typed(blobs[i + 2])))
    out_writes: list[Write] = []
    for w in writes:
        task, index, channel, path, wkind, wdata = w.split(b"\x00", 5)
        out_writes.append(
            Write(task.decode(), int(index), channel.decode(), Typed(wkind.decode(), wdata), path.decode())
        )
    return Checkpoint(
        session_id=session_id,
        namespace=namespace,
        checkpoint_id=checkpoint_id,
        parent_checkpoint_id=parent.decode(),
        checkpoint=Typed(kind.decode(), data),
        metadata_json=metadata_json.decode(),
        channel_versions=versions,
        channel_values=values,
        writes=out_writes,
        created_at_ms=int(created),
    )


# ---------------------------------------------------------------- at the edges of the hot store
# A session's framework state at the edges of the hot store: export, erasure, retirement to the archive
# and resumption from it. Retirement takes a snapshot (with the state's generation), writes it to the
# archive's ``checkpoints`` dataset, and drops the Redis keys only if the generation has not moved since:
# a checkpoint written in between keeps the state hot instead of losing it. Resumption puts the archived
# checkpoints back under their ids (idempotent: a resumption that dies half-way is redone).


def _typed_out(t: Typed) -> dict[str, str]:
    return {"type": t.type, "data_base64": base64.b64encode(t.data).decode()}


def _typed_in(d: dict[str, str]) -> Typed:
    return Typed(d["type"], base64.b64decode(d["data_base64"]))


def to_record(cp: Checkpoint) -> dict[str, Any]:
    """A JSON-ready record of one checkpoint: what ExportUserData yields and the archive stores."""
    return {
        "session_id": cp.session_id,
        "namespace": cp.namespace,
        "checkpoint_id": cp.checkpoint_id,
        "parent_checkpoint_id": cp.parent_checkpoint_id,
        "metadata": orjson.loads(cp.metadata_json) if cp.metadata_json else {},
        "checkpoint": _typed_out(cp.checkpoint),
        "channel_versions": cp.channel_versions,
        "channel_values": [{"channel": ch, "version": v, **_typed_out(t)} for ch, v, t in cp.channel_values],
        "pending_writes": [
            {"task_id": w.task_id, "index": w.index, "channel": w.channel, "task_path": w.task_path}
            | _typed_out(w.value)
            for w in cp.writes
        ],
        "created_at_ms": cp.created_at_ms,
    }


def from_record(session_id: str, r: dict[str, Any]) -> Checkpoint:
    return Checkpoint(
        session_id=session_id,
        namespace=r["namespace"],
        checkpoint_id=r["checkpoint_id"],
        parent_checkpoint_id=r["parent_checkpoint_id"],
        checkpoint=_typed_in(r["checkpoint"]),
        metadata_json=orjson.dumps(r["metadata"]).decode() if r["metadata"] else "",
        channel_versions=dict(r["channel_versions"]),
        channel_values=[(v["channel"], v["version"], _typed_in(v)) for v in r["channel_values"]],
        writes=[
            Write(w["task_id"], int(w["index"]), w["channel"], _typed_in(w), w.get("task_path", ""))
            for w in r["pending_writes"]
        ],
        created_at_ms=int(r.get("created_at_ms", 0)),
    )


async def export_checkpoints(
    store: CheckpointStore, session_ids: Sequence[str]
) -> AsyncIterator[dict[str, Any]]:
    """ExportUserData: every hot checkpoint of the sessions (archived ones come with the archive)."""
    for sid in session_ids:
        try:
            rows = await store.dump(sid)
        except ThreadRetired:
            continue  # its checkpoints are in the archive, exported with the archive's files
        for cp in rows:
            yield to_record(cp)


class CheckpointArchive(Protocol):
    """What the archiver needs of the archive (``pipelines/archive.py ArchiveStore`` is one): its
    ``checkpoints`` dataset. A protocol, so this room never imports the pipelines that use it."""

    async def write_checkpoints(self, session: Session, records: list[dict[str, Any]]) -> str: ...

    async def read_checkpoints(self, uri: str) -> list[dict[str, Any]]: ...


class CheckpointArchiver:
    def __init__(self, store: CheckpointStore, archive: CheckpointArchive) -> None:
        self._store = store
        self._archive = archive

    async def before_retire(self, session: Session) -> tuple[int | None, str]:
        """Archives the state; returns the generation to drop it at and the archive's URI, or (None, "")
        when the session has no checkpoints (then an archive named by an earlier retirement holds state
        deleted since, and is never restored)."""
        gen = await self._store.generation(session.session_id)
        rows = await self._store.dump(session.session_id)
        if not rows:
            return None, ""
        return gen, await self._archive.write_checkpoints(session, [to_record(c) for c in rows])

    async def after_retire(self, session_id: str, generation: int) -> bool:
        """Drops the hot state if it is still what was archived."""
        return await self._store.clear(session_id, generation) >= 0

    async def restore(self, session_id: str, uri: str) -> int:
        """Puts the archived state at ``uri`` back (a retirement's ``checkpoints_uri``)."""
        if not uri:
            return 0
        records = await self._archive.read_checkpoints(uri)
        for r in records:
            cp = from_record(session_id, r)
            await self._store.put(cp, cp.channel_values, restoring=True)
            if cp.writes:
                await self._store.put_writes(
                    session_id, cp.namespace, cp.checkpoint_id, cp.writes, restoring=True
                )
        return len(records)
