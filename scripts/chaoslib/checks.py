"""What a chaos trial checks once its workload stopped and every session it ended was archived: read
straight from the stores (Redis keys and events stream, the Parquet archive) and through the API
(memories, user export), never from a sidecar's memory."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

import memlane
from memlane import PromotionState

from .workload import Tally

CLOSED, EXPIRED, PROMOTED, ARCHIVED, RESUMED = 2, 3, 4, 5, 7

Call = Callable[..., Any]


def _state(r: Any, prefix: str, sid: str) -> int:
    return int(r.hget(f"{prefix}:{{{sid}}}:doc", "promotion_state") or 0)


def _settled(r: Any, prefix: str, sid: str) -> bool:
    # Archived, and no event still in the session's outbox: a killed sidecar's events are relayed by a
    # sweeper after the outbox grace period (sessions/events.py), not lost.
    archived = _state(r, prefix, sid) == PromotionState.PROMOTION_STATE_ARCHIVED
    return archived and not r.llen(f"{prefix}:{{{sid}}}:outbox")


def wait_archived(r: Any, prefix: str, sids: list[str], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    pending = list(sids)
    while pending and time.monotonic() < deadline:
        pending = [s for s in pending if not _settled(r, prefix, s)]
        if pending:
            time.sleep(0.5)


class Archive:
    """The transcripts of the Parquet archive (a directory, or s3:// with the S3 server's endpoint)."""

    def __init__(self, uri: str, s3_env: dict[str, str] | None) -> None:
        if uri.startswith("s3://"):
            assert s3_env is not None
            endpoint = s3_env["AWS_ENDPOINT_URL"]
            self.fs: pafs.FileSystem = pafs.S3FileSystem(
                access_key=s3_env["AWS_ACCESS_KEY_ID"],
                secret_key=s3_env["AWS_SECRET_ACCESS_KEY"],
                region=s3_env["AWS_REGION"],
                endpoint_override=endpoint.split("://", 1)[1],
                scheme=endpoint.split("://", 1)[0],
            )
            self.path = uri.removeprefix("s3://").rstrip("/") + "/transcripts"
        else:
            self.fs = pafs.LocalFileSystem()
            self.path = uri.rstrip("/") + "/transcripts"

    def seqs(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = collections.defaultdict(list)
        if self.fs.get_file_info(self.path).type == pafs.FileType.NotFound:
            return out
        hive = ds.partitioning(pa.schema([("date", pa.string()), ("channel", pa.string())]), flavor="hive")
        table = ds.dataset(self.path, filesystem=self.fs, format="parquet", partitioning=hive).to_table(
            columns=["session_id", "seq"]
        )
        for row in table.to_pylist():
            out[row["session_id"]].append(int(row["seq"]))
        return out


def _memories(call: Call, user_id: str) -> list[Any]:
    out: list[Any] = []

    def page(c: memlane.Client, token: str) -> Any:
        return c.list_memories(caller=memlane.Caller(user_id=user_id), page_size=500, page_token=token)

    token = ""
    while True:
        resp = call(lambda c, t=token: page(c, t))
        out.extend(resp.memories)
        token = resp.next_page_token
        if not token:
            return out


def check_trial(
    r: Any, prefix: str, archive: Archive, tally: Tally, call: Call, *, ltm: bool, deadline_s: float
) -> dict[str, int]:
    gone = {sid for user in tally.forgotten for sid in tally.sessions_of[user]}
    sids = sorted(tally.ended - gone)
    wait_archived(r, prefix, sids, deadline_s)
    events = collections.Counter((int(f[b"t"]), f[b"s"].decode()) for _, f in r.xrange(f"{prefix}:events"))
    archived = archive.seqs()
    out = collections.Counter[str]()

    def bad(what: str, sid: str, detail: str = "") -> None:
        out[what] += 1
        status = r.hget(f"{prefix}:{{{sid}}}:doc", "status")
        counts = [events[(t, sid)] for t in (CLOSED, EXPIRED, PROMOTED, ARCHIVED, RESUMED)]
        print(
            f"  {what}: {sid} status={status!r} events(closed, expired, promoted, archived, resumed)={counts}"
            f" {detail}"
        )

    for sid in sids:
        stored = {
            m.decode(): int(s) for m, s in r.zrange(f"{prefix}:{{{sid}}}:order", 0, -1, withscores=True)
        }
        lost = tally.acked[sid] - set(stored)
        out["acknowledged messages lost"] += len(lost)
        if lost:
            bad("session with lost messages", sid, f"lost={sorted(lost)}")
        out["duplicated messages"] += len(stored) - len(set(stored.values()))
        closed, expired = events[(CLOSED, sid)], events[(EXPIRED, sid)]
        promoted, archives = events[(PROMOTED, sid)], events[(ARCHIVED, sid)]
        resumed = events[(RESUMED, sid)]
        if sid in tally.by_ttl:
            # An append retried past the TTL resumes an expired session (RESUMED), which expires again:
            # one more EXPIRED than RESUMED, and one pipeline run per end at most (ends just apart may
            # share one run).
            ended_ok = closed == 0 and expired >= 1
            if expired != resumed + 1:
                bad("sessions revived without RESUMED", sid)
            runs_ok = 1 <= archives <= expired and (not ltm or 1 <= promoted <= expired)
        else:  # nothing follows a close: exactly one of each
            ended_ok = closed == 1 and expired == 0 and resumed == 0
            runs_ok = archives == 1 and (not ltm or promoted == 1)
        if not ended_ok:
            bad("sessions not ended exactly once", sid)
        if not runs_ok:
            bad("sessions not promoted / archived exactly once", sid)
        if sorted(archived.get(sid, [])) != sorted(stored.values()):
            bad("archives incomplete", sid, f"archived={len(archived.get(sid, []))} stored={len(stored)}")
    out.pop("session with lost messages", None)
    if ltm:
        memories = 0
        for user in sorted(tally.users - tally.forgotten):
            try:
                items = _memories(call, user)
            except (memlane.MemlaneError, RuntimeError) as exc:
                out["check calls failed"] += 1
                print(f"  ListMemories({user}) failed: {exc!r}")
                continue
            memories += len(items)
            # Every text the workload writes is unique to its session: one text twice from the same session
            # is a promotion that ran twice (a killed run redone) and wrote again.
            dup = collections.Counter((m.kind, m.content, m.source_session_id) for m in items)
            for (kind, content, sid), n in dup.items():
                if n > 1:
                    out["memories duplicated"] += n - 1
                    print(f"  memories duplicated: {sid} kind {kind} x{n}: {content!r}")
        out["memories"] = memories  # not a violation: the positive control of the check above
    for user in sorted(tally.forgotten):
        try:
            left = remains_of(r, prefix, archived, call, user=user, sids=tally.sessions_of[user], ltm=ltm)
        except (memlane.MemlaneError, RuntimeError) as exc:
            out["check calls failed"] += 1
            print(f"  erasure check of {user} failed: {exc!r}")
            continue
        if left:
            out["erasures incomplete"] += 1
            print(f"  erasure incomplete: {user}: {left}")
    out["erasures"] = len(tally.forgotten)
    out["erasure calls failed"] = tally.forget_failed
    out["requests failed with INTERNAL"] = tally.internal
    return dict(out)


def remains_of(
    r: Any, prefix: str, archived: dict[str, list[int]], call: Call, *, user: str, sids: set[str], ltm: bool
) -> dict[str, int]:
    """What is still held about an erased user, per store (empty: nothing)."""
    left: dict[str, int] = {}
    tags = {f"{{{sid}}}".encode() for sid in sids} | {f":user:{{{user}}}:".encode()}
    keys = sum(1 for k in r.scan_iter(match=f"{prefix}:*", count=1000) if any(t in k for t in tags))
    if keys:
        left["redis keys"] = keys
    rows = sum(len(archived.get(sid, [])) for sid in sids)
    if rows:
        left["archived turns"] = rows
    items = _memories(call, user) if ltm else []
    if items:
        left["memories"] = len(items)
    exported = call(lambda c: sum(1 for _ in c.export_user_data(user_id=user)))
    if exported:
        left["export records"] = exported
    return left
