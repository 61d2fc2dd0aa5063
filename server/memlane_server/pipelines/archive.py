"""Cold storage for ended sessions: Parquet files any analytics tool can read.

Layout (Hive-style partitions, so ``pyarrow.dataset``, DuckDB, Spark and Athena read it as three tables)::

    <root>/transcripts/date=2025-05-01/channel=web/<session_id>.<first_seq>-<last_seq>.parquet
    <root>/summaries/date=2025-05-01/channel=web/<session_id>.<first_seq>-<last_seq>.parquet
    <root>/traces/date=2025-05-01/channel=web/<session_id>.<first_seq>-<last_seq>.parquet

``date`` is the UTC day the session ended. One *part* covers the messages ``first_seq..last_seq`` archived
at one end of the session; a session resumed and ended again gets a second part with the new messages
only. Paths are deterministic, so re-archiving after a crash rewrites the same file; a file is written
under a ``_``-prefixed name (ignored by dataset readers) and then moved into place.

``root`` is a local directory or any URI pyarrow's filesystem layer opens (``s3://bucket/prefix``,
``gs://...``, ``file:///...``); for ``s3://`` the endpoint and credentials come from the AWS environment
variables (``infra/endpoints.py``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..infra.endpoints import arrow_filesystem
from ..sessions.model import ArchivePointer, Message, Role, Session, VisibilityKind
from .archive_tables import (
    CHECKPOINT_SCHEMA,
    ArchivePart,
    ms_dt,
    summary_table,
    trace_table,
    transcript_table,
    ts_ms,
)

PART_DATASETS = ("transcripts", "summaries", "traces")
# Framework state (LangGraph checkpoints), written when a session retires (checkpoints/store.py).
DATASETS = (*PART_DATASETS, "checkpoints")
_NULL_CHANNEL = "__HIVE_DEFAULT_PARTITION__"
_DAY_MS = 86_400_000


class ArchiveStore(Protocol):
    async def write(self, part: ArchivePart) -> ArchivePointer: ...

    async def read_messages(self, pointer: ArchivePointer, session_id: str, last_n: int) -> list[Message]:
        """The last ``last_n`` messages of one part, oldest first; [] if the part is gone (retention)."""
        ...

    async def write_checkpoints(self, session: Session, records: list[dict[str, Any]]) -> str:
        """Writes a session's framework state (one row per checkpoint); returns its URI."""
        ...

    async def read_checkpoints(self, uri: str) -> list[dict[str, Any]]: ...

    async def delete_expired(self, retention_for: Callable[[str], float], now_ms: int) -> int:
        """Deletes parts older than their channel's archive retention (seconds; 0 keeps forever)."""
        ...


def _channel_dir(channel: str) -> str:
    return "channel=" + (urllib.parse.quote(channel, safe="") if channel else _NULL_CHANNEL)


def _channel_of(dirname: str) -> str:
    value = dirname.removeprefix("channel=")
    return "" if value == _NULL_CHANNEL else urllib.parse.unquote(value)


class ParquetArchive:
    """``ArchiveStore`` on Parquet files through a pyarrow filesystem (local by default)."""

    def __init__(self, uri: str) -> None:
        if "://" in uri:
            self._fs, root = arrow_filesystem(uri)
            self._scheme = uri.split("://", 1)[0] + "://"
        else:
            self._fs, root = pafs.LocalFileSystem(), str(Path(uri).resolve())
            self._scheme = ""
        self.root = root.rstrip("/")
        self.uri = uri

    def _uri(self, path: str) -> str:
        return f"{self._scheme}{path}" if self._scheme and self._scheme != "file://" else path

    def _path(self, uri: str) -> str:
        return uri.split("://", 1)[1] if "://" in uri else uri

    def _part_path(self, dataset: str, part: ArchivePart) -> str:
        day = ms_dt(part.ended_at_ms).strftime("%Y-%m-%d")
        name = f"{part.session.session_id}.{part.first_seq:010d}-{part.last_seq:010d}.parquet"
        return f"{self.root}/{dataset}/date={day}/{_channel_dir(part.session.channel)}/{name}"

    async def write(self, part: ArchivePart) -> ArchivePointer:
        return await asyncio.to_thread(self._write_sync, part)

    def _write_sync(self, part: ArchivePart) -> ArchivePointer:
        tables = (transcript_table(part), summary_table(part), trace_table(part))
        paths = {}
        for dataset, table in zip(PART_DATASETS, tables, strict=True):
            path = self._part_path(dataset, part)
            self._put(path, table)
            paths[dataset] = path
        return ArchivePointer(
            self._uri(paths["transcripts"]),
            self._uri(paths["summaries"]),
            self._uri(paths["traces"]),
            part.first_seq,
            part.last_seq,
            len(part.messages),
        )

    def _put(self, path: str, table: pa.Table) -> None:
        parent, name = path.rsplit("/", 1)
        if not isinstance(self._fs, pafs.S3FileSystem):  # S3 has no directories, only key prefixes
            self._fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/_tmp-{name}"
        pq.write_table(table, tmp, filesystem=self._fs, compression="zstd")
        self._fs.move(tmp, path)

    async def read_messages(self, pointer: ArchivePointer, session_id: str, last_n: int) -> list[Message]:
        return await asyncio.to_thread(self._read_sync, pointer, session_id, last_n)

    async def write_checkpoints(self, session: Session, records: list[dict[str, Any]]) -> str:
        # Named like a part through the session's last seq, so retention, export and erasure treat it
        # as one; a later retirement of the same session rewrites it.
        day = ms_dt(int(dt.datetime.now(dt.UTC).timestamp() * 1000)).strftime("%Y-%m-%d")
        name = f"{session.session_id}.{0:010d}-{session.last_seq:010d}.parquet"
        path = f"{self.root}/checkpoints/date={day}/{_channel_dir(session.channel)}/{name}"
        table = pa.Table.from_pydict(
            {
                "session_id": [session.session_id] * len(records),
                "user_id": [session.user_id] * len(records),
                "namespace": [r["namespace"] for r in records],
                "checkpoint_id": [r["checkpoint_id"] for r in records],
                "record_json": [orjson.dumps(r).decode() for r in records],
            },
            schema=CHECKPOINT_SCHEMA,
        )
        await asyncio.to_thread(self._put, path, table)
        return self._uri(path)

    async def read_checkpoints(self, uri: str) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            path = self._path(uri)
            if self._fs.get_file_info(path).type != pafs.FileType.File:
                return []
            column = pq.read_table(path, columns=["record_json"], filesystem=self._fs).column("record_json")
            return [orjson.loads(r) for r in column.to_pylist()]

        return await asyncio.to_thread(read)

    def _read_sync(self, pointer: ArchivePointer, session_id: str, last_n: int) -> list[Message]:
        path = self._path(pointer.transcript)
        if self._fs.get_file_info(path).type != pafs.FileType.File:
            return []
        table = pq.read_table(path, filesystem=self._fs)
        rows = table.to_pylist()
        rows.sort(key=lambda r: r["seq"])
        if last_n >= 0:
            rows = rows[len(rows) - last_n :] if last_n else []
        return [
            Message(
                message_id=r["message_id"],
                session_id=session_id,
                role=Role[r["role"].upper()],
                content=r["content"],
                seq=int(r["seq"]),
                source_agent_id=r["source_agent_id"],
                participant_name=r["participant_name"],
                user_id=r["message_user_id"],
                channel=r["message_channel"],
                native_format=r["native_format"],
                native_json=r["native_json"],
                planning_steps=list(r["planning_steps"] or []),
                invoked=list(r["invoked"] or []),
                tool_call_ids=list(r["tool_call_ids"] or []),
                metadata=dict(r["metadata"] or []),
                visibility=VisibilityKind[r["visibility"].upper()],
                visibility_group=r["visibility_group"],
                created_at_ms=ts_ms(r["created_at"]),
                token_count=int(r["token_count"]),
            )
            for r in rows
        ]

    async def delete_expired(self, retention_for: Callable[[str], float], now_ms: int) -> int:
        return await asyncio.to_thread(self._delete_expired_sync, retention_for, now_ms)

    def _delete_expired_sync(self, retention_for: Callable[[str], float], now_ms: int) -> int:
        deleted = 0
        for dataset in DATASETS:
            base = f"{self.root}/{dataset}"
            if self._fs.get_file_info(base).type != pafs.FileType.Directory:
                continue
            for day_info in self._fs.get_file_info(pafs.FileSelector(base)):
                if day_info.type != pafs.FileType.Directory or not day_info.base_name.startswith("date="):
                    continue
                try:
                    day = dt.datetime.strptime(day_info.base_name[5:], "%Y-%m-%d").replace(tzinfo=dt.UTC)
                except ValueError:
                    continue
                day_start = int(day.timestamp() * 1000)
                for ch_info in self._fs.get_file_info(pafs.FileSelector(day_info.path)):
                    if ch_info.type != pafs.FileType.Directory:
                        continue
                    retention_ms = int(retention_for(_channel_of(ch_info.base_name)) * 1000)
                    if retention_ms <= 0:
                        continue
                    cutoff = now_ms - retention_ms
                    if day_start + _DAY_MS <= cutoff:  # the whole day is older: one directory delete
                        files = self._fs.get_file_info(pafs.FileSelector(ch_info.path))
                        deleted += sum(1 for f in files if f.type == pafs.FileType.File)
                        self._fs.delete_dir(ch_info.path)
                        continue
                    if day_start > cutoff:
                        continue
                    for f in self._fs.get_file_info(pafs.FileSelector(ch_info.path)):
                        if f.type == pafs.FileType.File and f.mtime is not None and ts_ms(f.mtime) < cutoff:
                            self._fs.delete_file(f.path)
                            deleted += 1
                if not self._fs.get_file_info(pafs.FileSelector(day_info.path)):
                    self._fs.delete_dir(day_info.path)
        return deleted

    # ------------------------------------------------------------------ per-user export and erasure
    # Every part file holds one session of one user, so a user's archive is a set of whole files: the
    # sessions Redis names for the user, plus any whose summary rows carry the user's id (a session
    # whose stub is gone). Only the summary files of sessions nobody is known to own are read: reading
    # every one made each export and erasure O(archive) (about 9 s for 450 sessions on a loaded 2-core
    # machine, past a client's deadline in the chaos campaign, and growing with every session archived).

    async def user_files(
        self,
        user_id: str,
        session_ids: set[str],
        owners: Callable[[list[str]], Awaitable[dict[str, str]]] | None = None,
    ) -> list[tuple[str, str]]:
        """(dataset, path) of every part file of the user's sessions. ``owners`` maps session ids to the
        user each belongs to, where that is known without the archive (their Redis documents); a summary
        file is read only for a session it leaves out."""
        files = await asyncio.to_thread(self._part_files)
        sids = set(session_ids)
        summaries = {_session_of(n): p for d, p, n in files if d == "summaries" and not n.startswith("_")}
        unknown = sorted(set(summaries) - sids)
        known = await owners(unknown) if owners is not None and unknown else {}
        sids |= {sid for sid, owner in known.items() if owner == user_id}
        to_read = [summaries[sid] for sid in unknown if sid not in known]
        sids |= await asyncio.to_thread(self._sessions_in, to_read, user_id)
        return [(dataset, path) for dataset, path, name in files if _session_of(name) in sids]

    def _part_files(self) -> list[tuple[str, str, str]]:
        """(dataset, path, file name) of every Parquet file of the archive."""
        files: list[tuple[str, str, str]] = []
        for dataset in DATASETS:
            base = f"{self.root}/{dataset}"
            if self._fs.get_file_info(base).type != pafs.FileType.Directory:
                continue
            for f in self._fs.get_file_info(pafs.FileSelector(base, recursive=True)):
                if f.type == pafs.FileType.File and f.base_name.endswith(".parquet"):
                    files.append((dataset, f.path, f.base_name))
        return files

    def _sessions_in(self, summary_paths: list[str], user_id: str) -> set[str]:
        """The sessions among these summary files whose rows carry ``user_id``."""
        out: set[str] = set()
        for path in summary_paths:
            try:
                users = pq.read_table(path, columns=["user_id"], filesystem=self._fs).column("user_id")
            except FileNotFoundError:
                continue  # erased meanwhile (another user's erasure): nothing of it to find
            if user_id in users.to_pylist():
                out.add(_session_of(path.rsplit("/", 1)[-1]))
        return out

    async def export_rows(self, files: list[tuple[str, str]]) -> list[tuple[str, list[dict[str, Any]]]]:
        """The rows of each file, as (dataset, rows)."""

        def read() -> list[tuple[str, list[dict[str, Any]]]]:
            return [(ds, pq.read_table(path, filesystem=self._fs).to_pylist()) for ds, path in files]

        return await asyncio.to_thread(read)

    async def delete_files(self, files: list[tuple[str, str]]) -> dict[str, int]:
        """Deletes the files; returns rows and files erased by dataset."""

        def delete() -> dict[str, int]:
            counts: dict[str, int] = {}
            for dataset, path in files:
                rows = pq.read_metadata(path, filesystem=self._fs).num_rows
                self._fs.delete_file(path)
                counts[f"archive.{dataset}_rows"] = counts.get(f"archive.{dataset}_rows", 0) + rows
                counts["archive.files"] = counts.get("archive.files", 0) + 1
            return counts

        return await asyncio.to_thread(delete)


_PART_NAME = re.compile(r"_?(?P<sid>.+)\.\d{10}-\d{10}\.parquet")


def _session_of(file_name: str) -> str:
    """The session id in a part file's name (ids may contain dots; the seq range is fixed-width)."""
    m = _PART_NAME.fullmatch(file_name)
    return m.group("sid") if m else ""
