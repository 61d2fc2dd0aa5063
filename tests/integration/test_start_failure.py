"""A sidecar whose start fails half way closes what it had opened: each part registers its close when it
is built, so ``stop`` after a failed ``start`` needs no probing for what exists."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from memlane_server.background import SidecarThread
from memlane_server.config import build_settings
from tests.conftest import ServerFactory, wait_for


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
        return True


def test_a_start_that_fails_at_bind_closes_the_embedded_redis(
    start_server: ServerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    taken = start_server().target  # this port is served: the second sidecar cannot bind it
    settings = build_settings(
        flags={
            "listen": taken,
            "admin_listen": "",
            "redis_url": "",  # an embedded Redis under data_dir, started before the bind fails
            "key_prefix": "startfail",
            "data_dir": str(tmp_path),
            "ltm_enabled": False,
            "shutdown_grace_seconds": 1.0,
        },
        env={},
    )
    sock = tmp_path / "redis" / "redis.sock"
    caplog.set_level(logging.INFO, logger="memlane")
    with pytest.raises(RuntimeError, match="Failed to bind"):  # grpc: the port is in use
        SidecarThread(settings).start()
    assert any("started embedded redis" in r.getMessage() for r in caplog.records)  # positive control
    # The sidecar's thread runs stop() after the failure: the embedded Redis goes down with it.
    wait_for(lambda: not _answers(sock), timeout=20)
    failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shutdown:")]
    assert failed == []
