"""Which archive files a user's export and erasure read, through the real server, Redis and a Parquet
archive on disk.

Found by the chaos campaign (docs/reliability.md): every ExportUserData and ForgetUser read the summary
file of every archived session of every user to find the user's own, so each took longer as the archive
grew (past a client's 15 s deadline at about 450 sessions on a loaded machine)."""

from __future__ import annotations

from pathlib import Path

import memlane
from memlane import Message, Role
from tests.conftest import ServerFactory, redis_client


def _archived(c: memlane.Client, user: str, text: str) -> str:
    sid = c.create_session(user_id=user).session.session_id
    c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content=text)])
    c.promote_session(session_id=sid, close=True)
    return sid


def _files(archive: Path, sid: str) -> list[Path]:
    return sorted(archive.glob(f"*/*/*/{sid}.*.parquet"))


def test_export_and_erasure_read_only_the_summaries_nobody_is_known_to_own(
    start_server: ServerFactory, redis_url: str, tmp_path: Path, user_id: str
) -> None:
    archive = tmp_path / "cold"
    srv = start_server(ltm_enabled=False, archive_uri=f"file://{archive}")
    keys = srv.sidecar.keys
    other = f"{user_id}-other"
    r = redis_client(redis_url)
    with memlane.Client(srv.target, timeout=60) as c:
        mine = _archived(c, user_id, "my own words")
        theirs = _archived(c, other, "somebody else's words")
        # A session of the user whose Redis document is gone: only its summary file names its user.
        orphan = _archived(c, user_id, "words whose stub is gone")
        r.delete(keys.session(orphan).doc)
        r.zrem(keys.user_sessions(user_id), orphan)
        assert len(_files(archive, mine)) == len(_files(archive, orphan)) == 3  # transcript, summary, traces
        # The other user's summary file, unreadable: a scan of every summary file fails on it.
        [their_summary] = [p for p in _files(archive, theirs) if p.parts[-4] == "summaries"]
        their_summary.write_bytes(b"not a parquet file")

        exported = [rec for rec in c.export_user_data(user_id=user_id) if rec.kind == "archive.transcripts"]
        text = b"".join(rec.data for rec in exported)
        assert b"my own words" in text and b"words whose stub is gone" in text
        assert b"somebody else" not in text

        receipt = c.forget_user(user_id=user_id)
        assert receipt.erased["archive.files"] == 6
        assert _files(archive, mine) == [] and _files(archive, orphan) == []
        assert len(_files(archive, theirs)) == 3
    r.close()
