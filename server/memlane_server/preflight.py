"""What a start checks before it loads anything heavy: the data dir (writable, and served by no other
sidecar), the listen addresses, the policy files, the tokenizers named and Redis. Each failure is one
``StartError`` naming the cause, within about two seconds of the start, instead of a traceback after the
model has loaded (13-21 s in) with an embedded Redis left running.

The data dir's lock (``DataDirLock``) is held for as long as a sidecar with an embedded Redis or that
Redis runs (the Redis inherits it): a second one on the same directory would run a second Redis on the
same files (and stopping either deletes the other's socket). Sidecars and workers on an external Redis
share a data dir by design (an archive or LTM directory on one host) and take no lock.

**What a start keeps from loading** (``defer_unused_packages``, called after the checks and before the
server's imports): third-party modules the sidecar never uses, kept from loading until something
touches them.

``lancedb`` imports ``lance_namespace``, which imports ``lance_namespace_urllib3_client`` for its model
classes; that package's ``__init__`` also imports every REST API class of the namespace service, and each
builds pydantic validators for all its methods at import: about 5 s of a 2-core pod's start-up, for a
client memlane never calls (it opens local or object-store tables, not a REST namespace). The package is
registered without running its ``__init__`` (its submodules, such as the models, import as usual); the
first attribute read from the package itself runs it in full, so nothing can observe the difference.

``onnxruntime`` is deferred the same way: a worker process of ``memlane serve`` embeds through the serving
process's model (embedding/remote.py) and never touches it, which keeps its library (about 20 MB) out of
the worker's memory; the serving process runs it in full when it loads the model.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.util
import logging
import os
import signal
import socket
import sys
import time
import types
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from .access.policy import PolicyError as AccessPolicyError
from .access.policy import PolicyFile
from .config import Settings
from .file_modes import tighten_data_dir
from .infra.redis_pool import unanswered
from .sessions.model import PolicyBook
from .sessions.model import PolicyError as ChannelPolicyError
from .tokens import ENCODINGS

log = logging.getLogger("memlane")

LOCK_FILE = "memlane.lock"
_REDIS_TIMEOUT_S = 2.0


class StartError(RuntimeError):
    """The sidecar cannot start; the message says why in one line."""


class DataDirLock:
    """An exclusive lock on ``<data_dir>/memlane.lock`` (released when the process ends, however). The
    embedded Redis inherits it (``fd``): the lock lasts until the sidecar and its Redis are both gone, and
    the file names both (``note_redis``), so a start that finds a Redis of a dead sidecar still holding it
    stops that Redis (``_stop_orphan``) instead of starting a second one on the same files."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def fd(self) -> int | None:
        return self._fd

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                self._held_by_another(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.note_redis(None)

    def _held_by_another(self, fd: int) -> None:
        """Returns once ``fd`` holds the lock after stopping an orphaned Redis of this data dir; raises
        ``StartError`` naming the holder otherwise."""
        holder, redis_pid = _holders(os.pread(fd, 64, 0).decode(errors="replace"))
        if redis_pid and _orphaned_redis(redis_pid, holder, self.path.parent):
            log.warning(
                "data_dir %s: stopping the embedded redis (pid %d) of a sidecar that is gone (pid %s)",
                self.path.parent,
                redis_pid,
                holder or "?",
            )
            _stop(redis_pid)
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            raise StartError(
                f"data_dir {self.path.parent} is still held by the orphaned redis-server (pid {redis_pid})"
                " of a sidecar that is gone: stop that process"
            )
        raise StartError(
            f"data_dir {self.path.parent} is already served by another memlane (pid {holder or '?'});"
            " stop it or give this one a data_dir of its own"
        )

    def note_redis(self, pid: int | None) -> None:
        """Writes this process's pid, and its embedded Redis's once started, into the lock file."""
        if self._fd is None:
            return
        text = f"{os.getpid()}\n" + (f"redis {pid}\n" if pid else "")
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text.encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _holders(text: str) -> tuple[str, int]:
    """The lock file's sidecar pid (as written) and its Redis's pid (0: none noted)."""
    lines = text.split("\n")
    redis_pid = 0
    for line in lines[1:]:
        word, _, value = line.partition(" ")
        if word == "redis" and value.strip().isdigit():
            redis_pid = int(value)
    return lines[0].strip(), redis_pid


def _orphaned_redis(pid: int, holder: str, data_dir: Path) -> bool:
    """Whether ``pid`` is a redis-server working in ``data_dir`` whose sidecar (``holder``) is not its
    parent any more: re-parented, so that sidecar is gone. Read from /proc (Linux); elsewhere never."""
    proc = Path(f"/proc/{pid}")
    try:
        cwd = Path(os.readlink(proc / "cwd"))
        ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return False
    # redis chdirs into its --dir, the data dir's redis/ (app.py); its parent is the sidecar while it lives
    return cwd.parent == data_dir.resolve() and ppid != holder


def _stop(pid: int) -> None:
    """SIGTERM (redis flushes its append-only file and exits; SIGCONT in case it was stopped), then
    SIGKILL if it is still there after ``_ORPHAN_STOP_S``."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    for last in (signal.SIGKILL, None):
        deadline = time.monotonic() + _ORPHAN_STOP_S
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if last is None or not _alive(pid):
            return  # gone, or unkillable: the lock says which (the caller's StartError)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, last)


def _alive(pid: int) -> bool:
    """Not a zombie and not gone (an orphan's parent, init, reaps it soon after it exits)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


_ORPHAN_STOP_S = 10.0


def data_dir(settings: Settings) -> Path:
    """The data dir, created if missing (its owner's alone), proven writable and tightened where others
    could read it (``file_modes``)."""
    path = Path(settings.server.data_dir)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        tighten_data_dir(path)
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


def encodings(settings: Settings) -> None:
    """The tokenizers named are ones this build ships (they are built later, after Redis starts)."""
    names = [settings.sessions.default_encoding, *settings.sessions.preload_encodings.split(",")]
    for name in (n.strip() for n in names):
        if name and name not in ENCODINGS:
            raise StartError(f"encoding {name!r} is unknown; known: {', '.join(ENCODINGS)}")


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
    encodings(settings)
    if settings.redis.redis_url:
        await redis_answers(settings.redis.redis_url)
    return path


# What a start keeps from loading (see the module's docstring).

_DEFERRED = ("lance_namespace_urllib3_client", "onnxruntime")


class _Deferred(types.ModuleType):
    def __getattr__(self, attr: str) -> object:
        if attr.startswith("__"):
            raise AttributeError(attr)
        spec = self.__spec__
        assert spec is not None and spec.loader is not None
        self.__class__ = types.ModuleType  # type: ignore[assignment]  # from now on an ordinary module
        spec.loader.exec_module(self)
        return getattr(self, attr)


def defer_unused_packages() -> None:
    """Call before importing the server (``app``); a no-op for packages already imported or absent."""
    for name in _DEFERRED:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _Deferred
        sys.modules[name] = module
