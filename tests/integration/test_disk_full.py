"""A full disk under long-term memory (a small tmpfs): the session end that cannot write its memories is
retried, not dropped, and finishes once space returns; meanwhile the sidecar keeps serving.

Mounting a tmpfs needs root (CI runs as root); elsewhere the test is skipped, and under
MEMLANE_REQUIRE_TOOLS=1 (CI) it fails instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import memlane
from memlane import Message, PromotionState, Role
from memlane.v1 import memory_pb2 as mpb
from tests.conftest import ServerFactory, wait_for

REQUIRE_TOOLS = os.environ.get("MEMLANE_REQUIRE_TOOLS") == "1"
ARCHIVED = PromotionState.PROMOTION_STATE_ARCHIVED


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)],
        check=False,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        why = f"cannot mount a tmpfs here (root needed): {out.stderr.strip()}"
        if REQUIRE_TOOLS:
            pytest.fail(why)
        pytest.skip(why)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path) -> Path:
    """Fills the disk to the last byte; returns the filler (delete it to free the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 4096, 1):  # unbuffered: every byte written is on the disk
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler


def test_a_session_end_that_meets_a_full_disk_is_retried_once_space_returns(
    start_server: ServerFactory, small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="memlane")
    user = f"u-{uuid.uuid4().hex[:8]}"
    srv = start_server(
        ltm_uri=str(small_disk / "ltm"),
        pipeline_claim_timeout_seconds=2,
        learn_every_turns=0,
        learn_idle_seconds=0,
    )
    who = mpb.Caller(user_id=user, agent_id="a1")
    with memlane.Client(srv.target, timeout=30) as c:
        c.create_memory(caller=who, kind=mpb.MEMORY_KIND_FACT, content="User's locker is L-17.")  # the table
        sid = c.create_session(user_id=user, agent_id="a1").session.session_id
        c.append_messages(
            session_id=sid,
            messages=[
                Message(role=Role.ROLE_USER, content="I moved to Porto last spring and I work as a nurse."),
                Message(role=Role.ROLE_ASSISTANT, content="Noted, thanks."),
            ],
        )
        filler = _fill(small_disk)
        c.close_session(session_id=sid)
        # The promotion cannot write: the session stays unarchived while the disk is full ...
        wait_for(
            lambda: (
                c.get_session(session_id=sid).session.promotion_state
                == PromotionState.PROMOTION_STATE_PROMOTING
            ),
            timeout=30,
        )
        # ... and the sidecar serves meanwhile (Redis is not on that disk).
        other = c.create_session(user_id=user, agent_id="a1").session.session_id
        c.append_messages(session_id=other, messages=[Message(role=Role.ROLE_USER, content="still here")])
        assert c.get_session(session_id=sid).session.promotion_state != ARCHIVED
        filler.unlink()  # space returns: the job, still queued, is taken again and finishes
        wait_for(lambda: c.get_session(session_id=sid).session.promotion_state == ARCHIVED, timeout=90)
        hits = c.search_memories(caller=who, query="where does the user live?", limit=5).results
        assert any("Porto" in h.memory.content for h in hits)
