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

import memlane
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


def test_a_start_that_fails_half_way_closes_the_embedded_redis(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure no check can see coming (the model file is unusable) comes after the embedded Redis
    started: that Redis goes down with the failed start."""
    bad_model = tmp_path / "model.onnx"
    bad_model.write_bytes(b"not a model")
    settings = build_settings(
        flags={
            "listen": "127.0.0.1:0",
            "admin_listen": "",
            "redis_url": "",  # an embedded Redis under data_dir, started before the model loads
            "key_prefix": "startfail",
            "data_dir": str(tmp_path / "data"),
            "embedding_model_path": str(bad_model),
            "shutdown_grace_seconds": 1.0,
        },
        env={},
    )
    sock = tmp_path / "data" / "redis" / "redis.sock"
    caplog.set_level(logging.INFO, logger="memlane")
    with pytest.raises(Exception, match="model"):
        SidecarThread(settings).start()
    assert any("started embedded redis" in r.getMessage() for r in caplog.records)  # positive control
    # The sidecar's thread runs stop() after the failure: the embedded Redis goes down with it.
    wait_for(lambda: not _answers(sock), timeout=20)
    failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shutdown:")]
    assert failed == []


def _serve(*flags: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memlane_server.cli", "serve", "--admin-listen", "", *flags],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in os.environ.items() if not k.startswith("MEMLANE_")},
    )


def _one_line_refusal(out: subprocess.CompletedProcess[str], says: str) -> None:
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("memlane: ") and says in lines[-1], lines
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("unreachable redis", "redis_url 'redis://:***@127.0.0.1:1'"),
        ("malformed redis url", "redis_url 'nonsense://x'"),
        ("grpc port in use", ": in use"),
        ("admin port in use", "admin_listen"),
        ("read-only data dir", "is not writable"),
        ("malformed channel policy file", "channels.yaml: channels: expected a mapping"),
        ("unknown encoding", "encoding 'o300k_base' is unknown; known: cl100k_base, o200k_base"),
    ],
)
def test_a_start_that_cannot_work_says_why_in_one_line_before_loading_anything(
    redis_url: str, tmp_path: Path, case: str, says: str
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = f"127.0.0.1:{busy.getsockname()[1]}"
        data = tmp_path / "data"
        flags = ["--redis-url", redis_url, "--data-dir", str(data), "--listen", "127.0.0.1:0"]
        if case == "unreachable redis":
            flags[1] = "redis://:hunter2@127.0.0.1:1"  # the password must not reach the message
        elif case == "malformed redis url":
            flags[1] = "nonsense://x"
        elif case == "grpc port in use":
            flags[-1] = taken
        elif case == "admin port in use":
            flags += ["--admin-listen", taken]
        elif case == "read-only data dir":
            data.mkdir()
            data.chmod(0o500)
            if os.access(data, os.W_OK):  # root writes anywhere: a path under a file is unwritable too
                data.chmod(0o700)
                (tmp_path / "file").write_text("")
                flags[3] = str(tmp_path / "file" / "data")
        elif case == "unknown encoding":
            flags += ["--preload-encodings", "cl100k_base,o300k_base"]
        else:
            policy = tmp_path / "channels.yaml"
            policy.write_text("channels: [not, a, mapping]\n")
            flags += ["--channel-policies-file", str(policy)]
        out = _serve(*flags)
    _one_line_refusal(out, says)
    assert "hunter2" not in out.stderr
    # No bound on how long the refusal took (it measured the machine as well): these are preflight's
    # refusals (app.py: _preflight runs before the Redis pool, the model and LanceDB are opened).
    assert "started embedded redis" not in out.stderr


def test_a_second_sidecar_on_a_served_data_dir_is_refused(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    first = start_server(redis_url="", data_dir=str(data), key_prefix="lock")
    sock = data / "redis" / "redis.sock"
    assert _answers(sock)
    out = _serve("--data-dir", str(data), "--listen", "127.0.0.1:0")
    _one_line_refusal(out, f"data_dir {data} is already served by another memlane (pid {os.getpid()})")
    # The first one's embedded Redis is untouched (the refused start neither ran a second Redis on its
    # files nor deleted its socket), and the first sidecar still serves.
    assert _answers(sock)
    with memlane.Client(first.target) as c:
        assert c.create_session(user_id="u-lock").session.session_id
    first.stop()
    # Positive control: once the first is gone, the directory is free again.
    again = start_server(redis_url="", data_dir=str(data), key_prefix="lock")
    again.stop()


def _serve_env(
    tmp_path: Path, redis_url: str, extra_env: dict[str, str]
) -> tuple[subprocess.Popen[str], Path]:
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
    proc, sock = _serve_env(tmp_path, redis_url, {"MEMLANE_LOG_LEVLE": "debug"})
    try:
        wait_for(lambda: _answers(sock) or proc.poll() is not None, timeout=120)
        assert proc.poll() is None  # a warning: the sidecar serves
    finally:
        err = _stop(proc)
    assert "$MEMLANE_LOG_LEVLE is not a memlane setting; did you mean $MEMLANE_LOG_LEVEL?" in err, err


def test_strict_env_refuses_a_misspelt_variable(tmp_path: Path, redis_url: str) -> None:
    proc, _ = _serve_env(tmp_path, redis_url, {"MEMLANE_STRICT_ENV": "true", "MEMLANE_REDIS_ULR": redis_url})
    try:
        code = proc.wait(timeout=60)
    finally:
        err = _stop(proc)
    assert code == 2, err
    assert "$MEMLANE_REDIS_ULR is not a memlane setting; did you mean $MEMLANE_REDIS_URL?" in err, err
    assert "Traceback" not in err
    # Positive control: strict, with every variable spelt right, it serves.
    ok, sock = _serve_env(tmp_path / "ok", redis_url, {"MEMLANE_STRICT_ENV": "true"})
    try:
        wait_for(lambda: _answers(sock) or ok.poll() is not None, timeout=120)
        assert ok.poll() is None
    finally:
        _stop(ok)
