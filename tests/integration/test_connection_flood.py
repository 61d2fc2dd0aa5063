"""One client cannot keep the others out by holding connections: a real ``memlane serve`` under a lowered
descriptor limit (600: a cap of 172 connections on each of its Unix-socket and TCP listeners), flooded on
each listener by connections that send nothing (raw sockets) and gRPC channels that connect and stay
idle, refilled up to the cap, still lets a real caller in within a second (the connections that sent no
request are shed, oldest first), and readiness says saturated meanwhile. Controls: under the cap a
connection that has sent a request stays open however long it idles, and one that never does is closed
within seconds (not gRPC's ten-second handshake timeout, nor its five-minute idle one). On the base, the
flood kept every caller out (``UNAVAILABLE ... Socket closed``) while ``/readyz`` said ok."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import memlane
from memlane_server.wiring.connections import FIRST_REQUEST_S, blocks
from tests.conftest import wait_for
from tests.integration.test_pod_faults import NOT_SERVING, Pod, pods  # noqa: F401 - a fixture

NOFILE = 600


def _channel(target: str) -> grpc.Channel:
    """A channel with a connection of its own (channels to one target share one by default)."""
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def _held(connect: Callable[[], socket.socket]) -> socket.socket | None:
    """A raw connection the server kept (it sent its SETTINGS), or None: closed as it was accepted."""
    s = connect()
    s.settimeout(2)
    try:
        if s.recv(64):
            return s
    except OSError:
        pass
    s.close()
    return None


def _fill(connect: Callable[[], socket.socket], room: int) -> list[socket.socket]:
    """Raw connections until the server closes one as it accepts it (the cap reached)."""
    out: list[socket.socket] = []
    for _ in range(room):
        s = _held(connect)
        if s is None:
            break
        out.append(s)
    return out


def _time_to_get_in(target: str) -> float:
    """Seconds until a real client's call succeeds (each try on a fresh connection, no retry of its own)."""
    start = time.monotonic()
    while True:
        try:
            with memlane.Client(target, timeout=2, retry=memlane.NO_RETRY) as c:
                c.list_sessions(user_id="u-flood", page_size=1)
            return time.monotonic() - start
        except memlane.MemlaneError as exc:
            if time.monotonic() - start > 10:
                raise AssertionError(f"kept out for 10 s: {exc}") from exc
            time.sleep(0.05)


@pytest.mark.parametrize("listener", ["unix", "tcp"])
def test_a_caller_gets_in_while_one_client_holds_every_connection(
    pods: list[Pod],  # noqa: F811
    tmp_path: Path,
    listener: str,
) -> None:
    pod = Pod(tmp_path, "a", tmp_path / "data", nofile=NOFILE, tcp=True)
    pods.append(pod)
    cap = int(pod.metric("memlane_grpc_connections_max")) // 2  # per listener
    assert cap == 172
    if listener == "tcp":
        target = f"127.0.0.1:{pod.tcp_port}"

        def connect() -> socket.socket:
            return socket.create_connection(("127.0.0.1", pod.tcp_port))
    else:
        target = pod.target

        def connect() -> socket.socket:
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(pod.sock))
            return s

    assert _time_to_get_in(target) < 1.0  # positive control: nothing held
    assert pod.http("/readyz")[0] == 200
    idle = [_channel(target) for _ in range(cap // 2)]  # gRPC channels that connect and never call
    raw: list[socket.socket] = []
    try:
        for ch in idle:
            grpc.channel_ready_future(ch).result(timeout=10)
        raw += _fill(connect, cap)
        time.sleep(1.0)  # the flood is a second old: older than the gate's grace
        raw += _fill(connect, cap)  # the holder takes back whatever was freed, up to the cap again
        took = _time_to_get_in(target)
        assert took < 1.0, took
        status, body = pod.http("/readyz")
        assert status == 503 and "saturated" in body, body
        assert pod.grpc_health() == NOT_SERVING
        assert pod.metric("memlane_grpc_connections_shed_total") > 0
        # Later callers get in too while the holder keeps refilling.
        raw += _fill(connect, cap)
        assert _time_to_get_in(target) < 1.0
    finally:
        for s in raw:
            s.close()
        for ch in idle:
            ch.close()
    wait_for(lambda: pod.http("/readyz")[0] == 200, timeout=60)  # saturation over, ready again


def test_under_the_cap_a_connection_that_asked_stays_and_one_that_never_asks_goes(
    pods: list[Pod],  # noqa: F811
    tmp_path: Path,
) -> None:
    pod = Pod(tmp_path, "a", tmp_path / "data", tcp=True)
    pods.append(pod)
    asked, silent = _channel(pod.target), _channel(f"127.0.0.1:{pod.tcp_port}")
    try:
        health_pb2_grpc.HealthStub(asked).Check(health_pb2.HealthCheckRequest(), timeout=10)
        grpc.channel_ready_future(silent).result(timeout=10)
        raw = _held(lambda: socket.create_connection(("127.0.0.1", pod.tcp_port)))
        assert raw is not None
        closed_after = _until_closed(raw, FIRST_REQUEST_S + 3)
        assert closed_after < FIRST_REQUEST_S + 2, closed_after  # not gRPC's 10 s handshake timeout
        # The channel that connected and never called was closed too (it connects again on a call) ...
        wait_for(lambda: _state(silent) != grpc.ChannelConnectivity.READY, timeout=5)
        # ... while the one that asked once stays connected, idle as long.
        assert _state(asked) == grpc.ChannelConnectivity.READY
        assert pod.http("/readyz")[0] == 200  # shedding the silent ones is no saturation
        assert _time_to_get_in(f"127.0.0.1:{pod.tcp_port}") < 1.0
        raw.close()
    finally:
        asked.close()
        silent.close()


def _until_closed(s: socket.socket, limit: float) -> float:
    """Seconds until the server closes ``s`` (reading what it sends meanwhile)."""
    start = time.monotonic()
    s.settimeout(limit)
    while s.recv(4096):
        pass
    return time.monotonic() - start


def _state(channel: grpc.Channel) -> grpc.ChannelConnectivity:
    seen: list[grpc.ChannelConnectivity] = []
    channel.subscribe(seen.append, try_to_connect=False)
    wait_for(lambda: bool(seen), timeout=5)
    channel.unsubscribe(seen.append)
    return seen[-1]


def test_blocks_match_connections_to_sockets_by_arrival() -> None:
    # Ticks 1 and 2 balance on their own; a connection seen at 3 whose socket shows at 4 joins 3 and 4.
    conns = [(1, False), (1, True), (2, False), (3, False), (4, False)]
    fds = [(1, 10), (1, 11), (2, 12), (4, 13), (4, 14)]
    assert blocks(conns, fds) == [([False, True], [10, 11]), ([False], [12]), ([False, False], [13, 14])]
    # A tail that does not balance is no block yet.
    assert blocks([(1, False), (2, False)], [(1, 10)]) == [([False], [10])]
