"""A session's framework state (LangGraph checkpoints) at the edges of the hot store: export, erasure,
retirement to the archive and resumption from it.

Retirement takes a snapshot (with the state's generation), writes it to the archive's ``checkpoints``
dataset, and drops the Redis keys only if the generation has not moved since: a checkpoint written in
between keeps the state hot instead of losing it. Resumption puts the archived checkpoints back under
their ids (idempotent: a resumption that dies half-way is redone).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson

from ..sessions.checkpoints import Checkpoint, CheckpointStore, ThreadRetired, Typed, Write
from ..sessions.model import Session
from .archive import ArchiveStore


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


class CheckpointArchiver:
    def __init__(self, store: CheckpointStore, archive: ArchiveStore) -> None:
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
