"""Hostile load on the sidecar's two doors (issue 25): a slowloris client and 1,000 idle connections on
the admin HTTP endpoint, and 1,000 concurrent WatchSessionEvents streams on the gRPC port. Neither may
stop other callers being answered promptly: /healthz and /metrics on the admin port, GetSession and
AppendMessages on the gRPC one; nothing acknowledged is lost.

Through the real server: real Redis, the real client for the probes (the flood of streams uses the
generated async stub, as a thousand sync generators would need a thousand threads here).
"""

from __future__ import annotations

import asyncio
import collections
import http.client
import socket
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

import memlane
from memlane import Message, Role
from memlane.v1 import session_service_pb2 as spb
from memlane.v1 import session_service_pb2_grpc as spb_grpc
from memlane_server.background import SidecarThread
from memlane_server.observability import http_endpoint
from tests.conftest import ServerFactory, wait_for

# A probe on a loaded 2-core machine: an answer well inside this is "prompt"; a stuck endpoint is not.
FLOOD = 1000
SETTLE_S = 10.0  # a stream still open this long after its call was admitted
WATCH_LIMIT = 32  # the default admission limit of WatchSessionEvents (config.py)


@pytest.fixture(scope="module")
def sidecar(start_server: ServerFactory) -> SidecarThread:
    return start_server(admin_listen="127.0.0.1:0", ltm_enabled=False)


@pytest.fixture(scope="module")
def c(sidecar: SidecarThread) -> Iterator[memlane.Client]:
    with memlane.Client(sidecar.target, timeout=10) as client:
        yield client


def _get(port: int, path: str) -> tuple[int, float]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - start
    finally:
        conn.close()


def _slowloris(port: int, stop: threading.Event, closed_after: list[float]) -> None:
    """Trickles a request head one byte a second, never finishing it; notes when the server hangs up."""
    sock = socket.create_connection(("127.0.0.1", port))
    start = time.perf_counter()
    try:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
            if stop.is_set():
                return
            sock.sendall(bytes([byte]))
            time.sleep(1.0)
            if _closed_by_peer(sock):
                closed_after.append(time.perf_counter() - start)
                return
    except OSError:
        closed_after.append(time.perf_counter() - start)
    finally:
        sock.close()


def test_slowloris_and_idle_connections_do_not_stop_health_and_metrics(sidecar: SidecarThread) -> None:
    port = sidecar.sidecar.admin_port or 0
    assert _get(port, "/healthz")[0] == 200  # positive control: the endpoint answers before the flood
    stop = threading.Event()
    closed_after: list[float] = []
    loris = threading.Thread(target=_slowloris, args=(port, stop, closed_after))
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(FLOOD)]
    loris.start()  # after the idle flood: it is not the oldest, so only its time bound ends it
    try:
        # Not yet a poll: every connection idle long enough past the head's bound is closed too, so only
        # a look before that bound tells shedding apart (an open item of issue 35, in the notes).
        time.sleep(1.0)  # every idle connection accepted by now
        # The connections still sending a head are bounded: the oldest idle ones were closed for the rest.
        shed = _closed(idle)
        print(f"\nidle connections closed at once: {shed} of {FLOOD}")
        assert shed >= FLOOD - http_endpoint.MAX_READING
        timings = []
        for path in ("/healthz", "/metrics") * 5:
            status, elapsed = _get(port, path)
            assert status == 200, path
            timings.append(elapsed)
        # How long they take is printed, not bounded here (it measures the machine as much as the code).
        print(f"\nadmin probes under {FLOOD} idle + slowloris: max {max(timings) * 1000:.0f} ms")
        # The idle connections do not stay open for ever: the head must arrive within the read bound.
        wait_for(
            lambda: _closed(idle) == FLOOD,
            timeout=60,
            describe=lambda: f"{FLOOD - _closed(idle)} idle connections still open",
        )
        # The slowloris needs over 1,000 s to send its head: hung up on long before, at the head's bound.
        wait_for(lambda: closed_after, timeout=60, describe=lambda: "the slowloris is still connected")
    finally:
        stop.set()
        for s in idle:
            s.close()
        loris.join()
    print(f"slowloris hung up on after {closed_after} s")
    assert _get(port, "/healthz")[0] == 200


def _closed(conns: list[socket.socket]) -> int:
    return sum(1 for s in conns if _closed_by_peer(s))


def _closed_by_peer(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)


async def _flood_streams(target: str, n: int, opened: asyncio.Event, stop: asyncio.Event) -> list[str]:
    """Opens ``n`` WatchSessionEvents streams over a few channels; returns each stream's end (status)."""
    channels = [grpc.aio.insecure_channel(target) for _ in range(10)]
    ends: list[str] = []
    started = 0

    async def one(i: int) -> None:
        nonlocal started
        call = spb_grpc.SessionServiceStub(channels[i % len(channels)]).WatchSessionEvents(
            spb.WatchSessionEventsRequest(user_id=f"watcher-{i}")
        )
        # An admitted stream sends nothing until an event; a refused one ends at once (trailers only).
        ended = asyncio.ensure_future(call.code())
        await asyncio.wait({ended}, timeout=SETTLE_S)
        if not ended.done():
            started += 1
            if started == n:
                opened.set()
            await stop.wait()
            call.cancel()
            ends.append("OPEN")
            return
        started += 1
        if started == n:
            opened.set()
        trailers = dict(await call.trailing_metadata() or ())
        ends.append(f"{(await call.code()).name} retry-after-ms={trailers.get('retry-after-ms')}")

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    await asyncio.gather(*tasks)
    for ch in channels:
        await ch.close()
    return ends


def test_a_thousand_watch_streams_leave_unary_calls_prompt(sidecar: SidecarThread, c: memlane.Client) -> None:
    sid = c.create_session(user_id="watch-flood-user").session.session_id
    loop = asyncio.new_event_loop()
    opened = asyncio.Event()
    stop = asyncio.Event()
    result: dict[str, list[str]] = {}

    def run() -> None:
        result["ends"] = loop.run_until_complete(_flood_streams(sidecar.target, FLOOD, opened, stop))

    flood = threading.Thread(target=run)
    flood.start()
    try:
        deadline = time.perf_counter() + SETTLE_S + 30
        while not opened.is_set() and time.perf_counter() < deadline:
            time.sleep(0.2)
        assert opened.is_set(), "the streams neither settled nor were refused in time"
        timings: list[float] = []
        for i in range(20):
            start = time.perf_counter()
            c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content=f"turn {i}")])
            c.get_session(session_id=sid)
            timings.append(time.perf_counter() - start)
        print(f"\nappend+get under {FLOOD} watch streams: max {max(timings) * 1000:.0f} ms")
    finally:
        loop.call_soon_threadsafe(stop.set)
        flood.join(60)
    loop.close()
    ends = result["ends"]
    print(f"stream ends: {collections.Counter(e.split('=')[0] for e in ends)}")
    assert c.get_session(session_id=sid).session.message_count == 20  # nothing acknowledged lost
    # The streams beyond the gate are refused at once, with a retry hint; the admitted ones stay open
    # (positive control: a watch is still served).
    admitted = ends.count("OPEN")
    assert 0 < admitted <= WATCH_LIMIT, collections.Counter(ends)
    refused = [e for e in ends if e != "OPEN"]
    assert len(refused) == FLOOD - admitted
    assert all(e.startswith("RESOURCE_EXHAUSTED retry-after-ms=") and not e.endswith("None") for e in refused)
