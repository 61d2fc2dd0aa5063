"""The cap on open gRPC connections and what keeps one caller from holding it: connections that have sent
no request are shed, oldest first, when a listener nears the cap, and after a few seconds in any case.

gRPC enforces the cap itself (``grpc.max_allowed_incoming_connections``, sized from RLIMIT_NOFILE): a
connection past it is closed as it is accepted, whoever makes it. gRPC has no notion of a connection that
connected and never asked anything (its idle timeout, minutes, counts from the connection's start too, and
its handshake timeout ends once the client's HTTP/2 SETTINGS arrive), and gives the servicer no hook on
connections. So the gate watches them from beside gRPC, every ``TICK_S``:

- **which connections sent a request**: gRPC's channelz (in this process, on by default) lists each
  server connection with the streams its client started;
- **which descriptor is which connection**: this process's descriptors (``/proc/self/fd``), the
  accepted sockets of each listener by their local address. Neither side names the other (a Unix-socket
  peer has no address), so the two are matched by arrival: both are listed oldest first (by the tick they
  were first seen in), and wherever the running counts agree, the connections before that point are the
  descriptors before it (``blocks``). A block whose connections all sent nothing is sheddable whichever
  of its descriptors goes; a block holding one that did is left alone;
- **shedding** is ``shutdown()`` of the socket (through a duplicate of gRPC's descriptor, checked to still
  be the same socket): gRPC sees the peer gone and closes the connection; a gRPC client that only held it
  idle connects again on its next call.

A connection older than ``FIRST_REQUEST_S`` that has sent no request is shed at any count; at the cap (a
listener within ``headroom`` of it) the oldest such connections older than ``GRACE_S`` go first, down to
two headrooms below, so a caller that arrives gets in while one client holds the rest. Readiness says
saturated while the gate sheds at the cap (and for ``SATURATED_S`` after).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..observability.health import PodMetrics

log = logging.getLogger("memlane")

TICK_S = 0.25
FIRST_REQUEST_S = 5.0  # the allowance of a connection before its first request
GRACE_S = 0.5  # a connection younger than this is never shed at the cap: its first request is on the way
SATURATED_S = 10.0
# gRPC's own backstops: a connection that never sends SETTINGS (its handshake), and one that runs no call.
_HANDSHAKE_TIMEOUT_MS = 10_000
_IDLE_MS = 5 * 60_000
# Descriptors left to everything but gRPC connections: the Redis pool (64), LanceDB's files, archives,
# the worker processes' pipes, the model. A quarter of the limit, at least this.
_FD_RESERVE = 256
_CAP_LOG_S = 60.0  # at most one "at the cap" line a minute
_FIND_S = 2.0


def connection_cap(nofile: int, listeners: int) -> int:
    """Open gRPC connections allowed per listener (gRPC counts them per listener): the descriptor limit
    less the reserve, shared by the listeners."""
    reserve = max(_FD_RESERVE, nofile // 4)
    return max(16, (nofile - reserve) // max(1, listeners))


def headroom(cap: int) -> int:
    return max(2, cap // 8)


@dataclass(slots=True)
class _Conn:
    listener: str
    tick: int  # first seen in
    used: bool = False


@dataclass(slots=True)
class _Fd:
    listener: str
    tick: int
    fd: int


def blocks(conns: list[tuple[int, bool]], fds: list[tuple[int, int]]) -> list[tuple[list[bool], list[int]]]:
    """The matched blocks of one listener: ``conns`` (tick first seen, sent a request) and ``fds`` (tick
    first seen, descriptor), each sorted by tick; a block ends wherever the running counts, taken at a
    tick's end, are equal. Yields (the block's connections' used flags, its sockets)."""
    out: list[tuple[list[bool], list[int]]] = []
    i = j = 0
    used: list[bool] = []
    held: list[int] = []
    while i < len(conns) or j < len(fds):
        tick = min(conns[i][0] if i < len(conns) else 1 << 62, fds[j][0] if j < len(fds) else 1 << 62)
        while i < len(conns) and conns[i][0] == tick:
            used.append(conns[i][1])
            i += 1
        while j < len(fds) and fds[j][0] == tick:
            held.append(fds[j][1])
            j += 1
        if i == j:  # as many connections as descriptors so far: the same ones
            out.append((used, held))
            used, held = [], []
    return out  # a tail that does not balance (one side seen a tick before the other) waits


@dataclass
class ConnectionGate:
    """The cap (gRPC's option) and the shedding beside it; ``watch`` once the listeners are bound, then
    ``tick`` every ``TICK_S``."""

    listeners: int
    metrics: PodMetrics
    nofile: int = 0
    cap: int = 0
    _keys: dict[str, str] = field(default_factory=dict)  # socket local address -> listener
    _conns: dict[int, _Conn] = field(default_factory=dict)  # channelz socket id
    _fds: dict[int, _Fd] = field(default_factory=dict)  # socket inode
    _others: set[int] = field(default_factory=set)  # inodes of sockets that are no accepted connection
    _gone: set[int] = field(default_factory=set)  # inodes shed, until gRPC has closed them
    _server: int = -1  # this sidecar's gRPC server in channelz, once a connection has named it
    _foreign: set[int] = field(default_factory=set)  # channelz sockets of another server in the process
    _found_at: float = -60.0  # when the servers were last listed to find this sidecar's
    _tick: int = 0
    _seen_at: dict[int, float] = field(default_factory=dict)  # tick -> monotonic time
    _saturated_at: float = -SATURATED_S
    _logged: float = -_CAP_LOG_S

    def __post_init__(self) -> None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.nofile = 1 << 20 if nofile == resource.RLIM_INFINITY else nofile
        self.cap = connection_cap(self.nofile, self.listeners)
        self.metrics.grpc_connections_max.set(self.cap * self.listeners)

    def options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_allowed_incoming_connections", self.cap),
            ("grpc.server_handshake_timeout_ms", _HANDSHAKE_TIMEOUT_MS),
            ("grpc.max_connection_idle_ms", _IDLE_MS),
        ]

    def watch(self, addresses: Iterable[str]) -> None:
        """The bound listen addresses (``host:port``, ``unix:path``), by the local address of a socket
        accepted on each."""
        for address in addresses:
            key = address[5:] if address.startswith("unix:") else address.rsplit(":", 1)[1]
            self._keys[key] = address

    async def health(self) -> str | None:
        if time.monotonic() - self._saturated_at < SATURATED_S:
            return (
                f"saturated at the cap ({self.cap} per listener): shedding connections that sent no request"
            )
        return None

    async def tick(self) -> None:
        now = time.monotonic()
        self._tick += 1
        self._seen_at[self._tick] = now
        changed = self._scan_channelz()
        counts: dict[str, int] = {}
        for c in self._conns.values():
            counts[c.listener] = counts.get(c.listener, 0) + 1
        self.metrics.grpc_connections.set(sum(counts.values()))
        due = [
            listener for listener in self._keys.values() if self._due(listener, counts.get(listener, 0), now)
        ]
        # The descriptors are read when a connection came or went (so each is first seen by the tick its
        # connection was, or the next) and when there is one to shed; not in a quiet tick (they cost
        # a system call each).
        if changed or due:
            self._scan_fds()
        for listener in due:
            self._shed(listener, counts.get(listener, 0), now)
        oldest = min(self._live_ticks(), default=self._tick)
        for t in [t for t in self._seen_at if t < oldest]:
            del self._seen_at[t]

    def _due(self, listener: str, count: int, now: float) -> bool:
        """Whether the listener is at the cap, or holds a connection past the first-request allowance."""
        if count >= self.cap - headroom(self.cap):
            return True
        return any(
            not c.used and c.listener == listener and now - self._seen_at.get(c.tick, now) >= FIRST_REQUEST_S
            for c in self._conns.values()
        )

    def _live_ticks(self) -> Iterable[int]:
        yield from (c.tick for c in self._conns.values())
        yield from (f.tick for f in self._fds.values())

    def _shed(self, listener: str, count: int, now: float) -> None:
        crowded = count >= self.cap - headroom(self.cap)
        if crowded:
            self.metrics.grpc_connections_shed.inc()
            self._saturated_at = now
            if now - self._logged >= _CAP_LOG_S:
                self._logged = now
                log.warning(
                    "gRPC connections at the cap (%d per listener, from the descriptor limit %d): shedding"
                    " those that sent no request; raise the limit (ulimit -n) if these callers are"
                    " legitimate",
                    self.cap,
                    self.nofile,
                )
        mine = [(i, f) for i, f in self._fds.items() if f.listener == listener]
        going = sum(1 for i, _ in mine if i in self._gone)
        excess = count - going - (self.cap - 2 * headroom(self.cap)) if crowded else 0
        conns = sorted((c.tick, c.used) for c in self._conns.values() if c.listener == listener)
        victims: list[int] = []
        for used, held in blocks(conns, sorted((f.tick, i) for i, f in mine)):
            if any(used):
                continue
            for inode in held:
                age = now - self._seen_at.get(self._fds[inode].tick, now)
                if inode in self._gone:
                    continue
                if age >= FIRST_REQUEST_S or (len(victims) < excess and age >= GRACE_S):
                    victims.append(inode)
        for inode in victims:
            self._shutdown(inode)
        if victims:
            self.metrics.grpc_connections_closed_unused.inc(len(victims))

    def _shutdown(self, inode: int) -> None:
        """Shuts the socket down (gRPC then closes its descriptor); its records go when it is gone."""
        self._gone.add(inode)
        with contextlib.suppress(OSError):
            dup = os.dup(self._fds[inode].fd)
            try:
                if os.fstat(dup).st_ino == inode:  # still that socket (gRPC may have closed and reused it)
                    with socket.socket(fileno=os.dup(dup)) as sock:
                        sock.shutdown(socket.SHUT_RDWR)
            finally:
                os.close(dup)

    def _scan_fds(self) -> None:
        """The accepted sockets of the listeners among this process's descriptors (new ones classified
        once, by inode)."""
        alive: set[int] = set()
        for name in os.listdir("/proc/self/fd"):
            try:
                link = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            if not link.startswith("socket:["):
                continue
            inode = int(link[8:-1])
            alive.add(inode)
            if inode in self._others or inode in self._fds:
                continue
            listener = self._listener_of(int(name))
            if listener is None:
                self._others.add(inode)
            else:
                self._fds[inode] = _Fd(listener, self._tick, int(name))
        self._others &= alive
        self._gone &= alive
        for inode in [i for i in self._fds if i not in alive]:
            del self._fds[inode]

    def _listener_of(self, fd: int) -> str | None:
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:
                local, peer = sock.getsockname(), sock.getpeername()  # a listener has no peer: OSError
                family = sock.family
        except OSError:
            return None
        if family == socket.AF_UNIX:
            key = local if isinstance(local, str) and local and not peer else None
        elif family in (socket.AF_INET, socket.AF_INET6):
            key = str(local[1])
        else:
            key = None
        return self._keys.get(key) if key else None

    def _scan_channelz(self) -> bool:
        """The connections of this sidecar's server (channelz lists every gRPC server of the process: the
        first connection on one of the listeners names it), each asked whether it sent a request until
        it has. True when a connection came or went."""
        from grpc._cython import cygrpc  # noqa: PLC0415 - channelz's own entry points (grpcio-channelz's)

        alive: set[int] = set()
        for server_id, refs in self._server_sockets(cygrpc):
            for ref in refs.get("socketRef", []):
                sid = int(ref["socketId"])
                alive.add(sid)
                known = self._conns.get(sid)
                if (known is not None and known.used) or sid in self._foreign:
                    continue  # a connection that sent a request is the gate's no more
                with contextlib.suppress(ValueError, KeyError):
                    data = json.loads(cygrpc.channelz_get_socket(sid))["socket"]
                    listener = self._listener_key(data.get("local", {}))
                    if listener is None:
                        self._foreign.add(sid)
                        continue
                    self._server = server_id
                    if known is None:
                        known = self._conns[sid] = _Conn(listener, self._tick)
                    known.used = int(data.get("data", {}).get("streamsStarted", 0)) > 0
        self._foreign &= alive
        gone = [s for s in self._conns if s not in alive]
        for sid in gone:
            del self._conns[sid]
        return bool(gone) or self._tick in {c.tick for c in self._conns.values()}

    def _server_sockets(self, cygrpc: Any) -> list[tuple[int, dict[str, Any]]]:
        """The socket references of this sidecar's server, or of every server until one is known as this
        sidecar's (listing the servers costs far more than their sockets: at most every ``_FIND_S``)."""
        if self._server >= 0:
            with contextlib.suppress(ValueError):  # a server gone from channelz
                refs = json.loads(cygrpc.channelz_get_server_sockets(self._server, 0, 1 << 20))
                return [(self._server, refs)]
            self._server = -1
        if time.monotonic() - self._found_at < _FIND_S:
            return []
        self._found_at = time.monotonic()
        servers = json.loads(cygrpc.channelz_get_servers(0)).get("server", [])
        ids = [int(s["ref"]["serverId"]) for s in servers]
        return [(i, json.loads(cygrpc.channelz_get_server_sockets(i, 0, 1 << 20))) for i in ids]

    def _listener_key(self, local: dict[str, dict[str, object]]) -> str | None:
        if "udsAddress" in local:
            return self._keys.get(str(local["udsAddress"].get("filename", "")))
        if "tcpipAddress" in local:
            return self._keys.get(str(local["tcpipAddress"].get("port", "")))
        return None
