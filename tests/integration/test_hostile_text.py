"""Hostile text cannot take the sidecar away from serving: a session holding one 120 KB turn of
``"a." * 60000`` (accepted by AppendMessages; anyone typing into a chat box can send it) is promoted
while the health check and GetSession keep answering. Before, the PII patterns rescanned that turn from
every word start under the interpreter lock: health timed out for minutes. How fast the probes answer is
printed, not bounded: the bench's isolation row tracks it (bench/processes.py, the same turn), and
tests/unit/test_patterns_linear_time.py checks the patterns themselves.

Through the real server: real Redis, LanceDB, ONNX embeddings, the rules extractor, the real client.
"""

from __future__ import annotations

import http.client
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from tests.conftest import ServerFactory

HOSTILE = "a." * 60000
# Each call's deadline, generous for a loaded machine (the promotion takes a second or two: the
# embedding); a probe or promotion stalled as before (minutes) still fails on it.
CALL_DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def sidecar(start_server: ServerFactory) -> SidecarThread:
    return start_server(admin_listen="127.0.0.1:0")


def _healthz(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CALL_DEADLINE_S)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_huge_turn_is_promoted_while_health_and_reads_answer(sidecar: SidecarThread, user_id: str) -> None:
    with memlane.Client(sidecar.target, timeout=CALL_DEADLINE_S) as c:
        sid = c.create_session(user_id=user_id).session.session_id
        c.append_messages(
            session_id=sid,
            messages=[
                Message(role=Role.ROLE_USER, content=HOSTILE),
                Message(role=Role.ROLE_ASSISTANT, content="That is a long message."),
                # Positive control: personal data in an ordinary turn is still redacted.
                Message(
                    role=Role.ROLE_USER, content="Write to me at jo.doe@example.com about the Lisbon trip."
                ),
                Message(role=Role.ROLE_ASSISTANT, content="Noted, I will write about the Lisbon trip."),
            ],
        )
        done: dict[str, float] = {}

        def promote() -> None:
            start = time.perf_counter()
            with memlane.Client(sidecar.target, timeout=CALL_DEADLINE_S) as p:
                p.promote_session(session_id=sid, close=True)
            done["elapsed"] = time.perf_counter() - start

        worker = threading.Thread(target=promote)
        worker.start()
        probes: list[tuple[str, float]] = []
        port = sidecar.sidecar.admin_port or 0
        with grpc.insecure_channel(sidecar.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while worker.is_alive() or not probes:
                for name, probe in (
                    ("healthz", lambda: _healthz(port) == 200),
                    (
                        "grpc health",
                        lambda: (
                            health.Check(health_pb2.HealthCheckRequest(), timeout=CALL_DEADLINE_S).status
                            == health_pb2.HealthCheckResponse.SERVING
                        ),
                    ),
                    ("GetSession", lambda: c.get_session(session_id=sid).session.session_id == sid),
                ):
                    start = time.perf_counter()
                    assert probe(), name
                    probes.append((name, time.perf_counter() - start))
                time.sleep(0.05)  # a prober's pace, not a wait for anything
        worker.join()  # ended: the promotion's own call has its deadline
        assert "elapsed" in done, "PromoteSession failed"
        slowest = max(probes, key=lambda p: p[1])

        memories = c.list_memories(caller=mpb.Caller(user_id=user_id), page_size=500).memories
        contents = [m.content for m in memories]
        # The huge turn is stored as no memory of unbounded size (it holds nothing to recall, so the
        # picky-episode rule stores none at all); the address in the ordinary turn is redacted.
        assert contents and all(len(t) < 1400 for t in contents), [t[:80] for t in contents]
        assert any("[EMAIL]" in t and "Lisbon" in t for t in contents), contents
        assert not any("jo.doe@example.com" in t for t in contents)
    name, seconds = slowest
    print(
        f"promoted in {done['elapsed']:.2f} s; {len(probes)} probes, slowest {name} {seconds * 1000:.0f} ms"
    )
