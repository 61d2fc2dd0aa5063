"""kill -9 during ForgetUser: the erasure is in the journal before it touches anything, so another sidecar
finishes it (nothing is left of the user) instead of leaving it silently half done."""

from __future__ import annotations

import contextlib
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import memlane
from memlane.v1 import memory_pb2
from memlane_server.keyspace import KeySpace
from tests.conftest import delete_prefix, redis_client, wait_for
from tests.integration.test_session_end_pipeline import SidecarProcess
from tests.integration.test_user_data import _archive_text, _fill, _redis_bytes


@pytest.fixture()
def prefix(redis_url: str) -> Iterator[str]:
    p = f"te{uuid.uuid4().hex[:10]}"
    yield p
    delete_prefix(redis_url, p)


def test_an_erasure_whose_sidecar_was_killed_is_finished_by_another(
    prefix: str, redis_url: str, tmp_path: Path
) -> None:
    data = tmp_path / "shared"  # LTM and archive, as an s3:// root would be shared
    keys = KeySpace(prefix)
    user, mark = f"dora-{uuid.uuid4().hex[:6]}", f"narwhal{uuid.uuid4().hex[:10]}"
    r = redis_client(redis_url)
    a = SidecarProcess(tmp_path, "a", redis_url, prefix, data, learn_every_turns=0, learn_idle_seconds=0)
    b: SidecarProcess | None = None
    try:
        with memlane.Client(a.target, timeout=120) as c:
            sid = _fill(c, user, mark)
        assert mark.encode() in _redis_bytes(redis_url, prefix)  # positive control: it is all there
        assert mark in _archive_text(data / "archive")
        # A session end of the user's "still running" (its lease held): the erasure waits for it, inside
        # the journal, when its sidecar is killed.
        r.set(keys.lease(sid), "held-by-the-test", px=120_000)

        def forget() -> None:
            # The sidecar dies under the call.
            with (
                memlane.Client(a.target, timeout=120, retry=memlane.NO_RETRY) as c2,
                contextlib.suppress(memlane.MemlaneError),
            ):
                c2.forget_user(user_id=user)

        call = threading.Thread(target=forget, daemon=True)
        call.start()
        wait_for(lambda: r.hexists(keys.erasures(), user) and r.exists(keys.erasing(user)), timeout=30)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        call.join(30)
        r.delete(keys.lease(sid))  # the session end "finished"
        assert mark.encode() in _redis_bytes(redis_url, prefix)  # nothing was erased yet
        b = SidecarProcess(tmp_path, "b", redis_url, prefix, data, learn_every_turns=0, learn_idle_seconds=0)
        # b finds the journal entry with no live erasure (a's lease lapses) and runs it again.
        wait_for(lambda: not r.hexists(keys.erasures(), user), timeout=120)
        raw = _redis_bytes(redis_url, prefix)
        assert mark.encode() not in raw and user.encode() not in raw
        assert mark not in _archive_text(data / "archive")
        with memlane.Client(b.target, timeout=30) as c:
            with pytest.raises(memlane.NotFoundError):
                c.get_session(session_id=sid)
            assert not c.search_memories(caller=memory_pb2.Caller(user_id=user), query=mark).results
    finally:
        for p in (a, b):
            if p is not None:
                p.stop()
        r.close()
