"""A sidecar whose start fails half way closes what it had opened: each part registers its close when it
is built, so ``stop`` after a failed ``start`` needs no probing for what exists."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import uuid
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


def _serve(tmp_path: Path, redis_url: str, extra_env: dict[str, str]) -> tuple[subprocess.Popen[str], Path]:
    """``memlane serve`` as an operator runs it: its own process, configured by MEMLANE_* variables."""
    sock = tmp_path / "memlane.sock"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "PYTHONPATH": os.pathsep.join(sys.path),
        "MEMLANE_LISTEN": f"unix:{sock}",
        "MEMLANE_ADMIN_LISTEN": "",
        "MEMLANE_REDIS_URL": redis_url,
        "MEMLANE_KEY_PREFIX": f"t{uuid.uuid4().hex[:10]}",
        "MEMLANE_DATA_DIR": str(tmp_path / "data"),
        "MEMLANE_LTM_ENABLED": "false",
        **extra_env,
    }
    code = "import sys; from memlane_server.cli import main; sys.exit(main(['serve']))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    return proc, sock


def _stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return err


def test_a_misspelt_variable_is_named_with_its_closest_setting(tmp_path: Path, redis_url: str) -> None:
    proc, sock = _serve(tmp_path, redis_url, {"MEMLANE_LOG_LEVLE": "debug"})
    try:
        wait_for(lambda: _answers(sock) or proc.poll() is not None, timeout=120)
        assert proc.poll() is None  # a warning: the sidecar serves
    finally:
        err = _stop(proc)
    assert "$MEMLANE_LOG_LEVLE is not a memlane setting; did you mean $MEMLANE_LOG_LEVEL?" in err, err


def test_strict_env_refuses_a_misspelt_variable(tmp_path: Path, redis_url: str) -> None:
    proc, _ = _serve(tmp_path, redis_url, {"MEMLANE_STRICT_ENV": "true", "MEMLANE_REDIS_ULR": redis_url})
    try:
        code = proc.wait(timeout=60)
    finally:
        err = _stop(proc)
    assert code == 2, err
    assert "$MEMLANE_REDIS_ULR is not a memlane setting; did you mean $MEMLANE_REDIS_URL?" in err, err
    assert "Traceback" not in err
    # Positive control: strict, with every variable spelt right, it serves.
    ok, sock = _serve(tmp_path / "ok", redis_url, {"MEMLANE_STRICT_ENV": "true"})
    try:
        wait_for(lambda: _answers(sock) or ok.poll() is not None, timeout=120)
        assert ok.poll() is None
    finally:
        _stop(ok)
