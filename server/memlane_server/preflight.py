"""What a start checks before it loads anything heavy: the data dir (writable, and served by no other
sidecar), the listen addresses, the policy files and Redis. Each failure is one ``StartError`` naming the
cause, within about two seconds of the start, instead of a traceback after the model has loaded (13-21 s
in) with an embedded Redis left running.

The data dir's lock (``DataDirLock``) is held for as long as a sidecar with an embedded Redis runs: a
second one on the same directory would run a second Redis on the same files (and stopping either
deletes the other's socket). Sidecars and workers on an external Redis share a data dir by design (an
archive or LTM directory on one host) and take no lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from .access.policy import PolicyError as AccessPolicyError
from .access.policy import PolicyFile
from .config import Settings
from .infra.redis_pool import unanswered
from .sessions.channel_policies import PolicyBook
from .sessions.channel_policies import PolicyError as ChannelPolicyError

LOCK_FILE = "memlane.lock"
_REDIS_TIMEOUT_S = 2.0


class StartError(RuntimeError):
    """The sidecar cannot start; the message says why in one line."""


class DataDirLock:
    """An exclusive lock on ``<data_dir>/memlane.lock`` (released when the process ends, however)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise StartError(
                    f"data_dir {self.path.parent} is already served by another memlane (pid {holder});"
                    " stop it or give this one a data_dir of its own"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def data_dir(settings: Settings) -> Path:
    """The data dir, created if missing and proven writable."""
    path = Path(settings.server.data_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StartError(f"data_dir {path} is not writable: {exc.strerror or exc}") from None
    return path


def listen_addresses(settings: Settings) -> None:
    """Every TCP address free to bind (the gRPC and the admin one); Unix sockets' directories writable."""
    s = settings.server
    wanted = [("listen", a.strip()) for a in s.listen.split(",") if a.strip()]
    if s.admin_listen:
        wanted.append(("admin_listen", s.admin_listen))
    for name, address in wanted:
        if address.startswith("unix:"):
            parent = Path(address[len("unix:") :].removeprefix("//")).parent
            if parent.exists() and not os.access(parent, os.W_OK):
                raise StartError(f"{name} {address}: the directory {parent} is not writable")
            continue
        host, _, port = address.rpartition(":")
        try:
            port_n = int(port)
        except ValueError:
            raise StartError(f"{name} {address!r}: expected HOST:PORT or unix:/path") from None
        if port_n == 0:
            continue
        host = host.strip("[]") or "127.0.0.1"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
            try:
                probe.bind((host, port_n))
            except OSError as exc:
                why = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
                raise StartError(f"{name} {address}: {why}") from None


# What a start that cannot work raises: its own checks, and the policy files' own errors (each names the
# file and the entry at fault), which callers of ``Sidecar.start`` already catch by type.
START_ERRORS = (StartError, ChannelPolicyError, AccessPolicyError)


def policy_files(settings: Settings) -> None:
    """Both policy files parse (their errors name the file and the entry)."""
    lc = settings.lifecycle
    PolicyBook.load(lc.channel_policies_file, default_expire_after=settings.sessions.session_ttl_seconds)
    if settings.access.access_policy_file:
        PolicyFile(Path(settings.access.access_policy_file))


async def redis_answers(url: str) -> None:
    """A configured Redis answers a PING within two seconds (an embedded one is started later)."""
    why = await unanswered(url, _REDIS_TIMEOUT_S)
    if why is not None:
        raise StartError(f"redis_url {_without_password(url)!r}: {why.replace(url, '...')}")


def _without_password(url: str) -> str:
    """The URL as an operator may read it in a log: a password becomes ``***``."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


async def check(settings: Settings, *, listens: bool) -> Path:
    """Every check but the lock; returns the data dir. ``listens``: the listen addresses too (a worker
    binds none)."""
    path = data_dir(settings)
    if listens:
        listen_addresses(settings)
    policy_files(settings)
    if settings.redis.redis_url:
        await redis_answers(settings.redis.redis_url)
    return path
