"""The isolation row: while the worker promotes a session holding one 120 KB turn (``"a." * 60000``, the
input that froze the single-process sidecar for minutes) and ten ordinary sessions, the serving process
answers gRPC health probes and appends of another session as if nothing were queued."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import memlane
from memlane import Message, PromotionState, Role
from memlane.v1 import memory_pb2

from .report import Report
from .runner import Latency, percentiles

HOSTILE = "a." * 60000
ORDINARY = 10
TURNS = 50
LIMIT_S = 120.0  # the row stops probing then, ended or not (the figure says how many ended)


def _sessions(c: memlane.Client) -> list[str]:
    hostile = c.create_session(user_id="isolation-0", agent_id="bench-agent").session.session_id
    c.append_messages(
        session_id=hostile,
        messages=[
            Message(role=Role.ROLE_USER, content=HOSTILE),
            Message(role=Role.ROLE_ASSISTANT, content="Ok."),
        ],
    )
    out = [hostile]
    for k in range(1, ORDINARY + 1):
        sid = c.create_session(user_id=f"isolation-{k}", agent_id="bench-agent").session.session_id
        c.append_messages(
            session_id=sid,
            messages=[
                Message(
                    role=Role.ROLE_USER if j % 2 == 0 else Role.ROLE_ASSISTANT,
                    content=f"Turn {j}: my locker is L-{k}{j:03d} and I prefer the early shift.",
                )
                for j in range(TURNS)
            ],
        )
        out.append(sid)
    return out


def isolation(report: Report, target: str, *, searcher: str = "searcher") -> None:
    """``searcher``: a user with memories, whose searches (a query embedding each) are timed too."""
    health_s: list[float] = []
    append_s: list[float] = []
    search_s: list[float] = []
    with memlane.Client(target, timeout=60) as c, grpc.insecure_channel(target) as channel:
        probe = health_pb2_grpc.HealthStub(channel)
        ending = _sessions(c)
        live = c.create_session(user_id="isolation-live", agent_id="bench-agent").session.session_id
        caller = memory_pb2.Caller(user_id=searcher, agent_id="bench-agent")
        for sid in ending:
            c.close_session(session_id=sid)
        t0 = time.perf_counter()
        ended = 0
        while time.perf_counter() - t0 < LIMIT_S:
            s = time.perf_counter()
            probe.Check(health_pb2.HealthCheckRequest(), timeout=30)
            health_s.append(time.perf_counter() - s)
            s = time.perf_counter()
            c.append_messages(
                session_id=live, messages=[Message(role=Role.ROLE_USER, content="still there?")]
            )
            append_s.append(time.perf_counter() - s)
            s = time.perf_counter()
            c.search_memories(caller=caller, query=f"which locker, question {len(search_s)}?", limit=10)
            search_s.append(time.perf_counter() - s)
            if len(append_s) % 20 == 0:
                states = [c.get_session(session_id=sid).session.promotion_state for sid in ending]
                ended = sum(st == PromotionState.PROMOTION_STATE_ARCHIVED for st in states)
                if ended == len(ending):
                    break
            time.sleep(0.02)
        took = time.perf_counter() - t0
    note = f"{ended} of {len(ending)} sessions ended in {took:.1f} s"
    worst = max(health_s) * 1000  # Latency holds milliseconds
    report.latency(
        Latency(
            "isolation: health probe while a 120 KB turn + 10 sessions are promoted (max)",
            worst,
            worst,
            len(health_s),
        ),
        p99_ms=1000,
        note=note,
    )
    p50, p99 = percentiles(append_s)
    report.latency(
        Latency("isolation: AppendMessages meanwhile", p50, p99, len(append_s)), p99_ms=100, note=note
    )
    p50, p99 = percentiles(search_s)
    report.latency(
        Latency("isolation: SearchMemories meanwhile (a query embedding each)", p50, p99, len(search_s))
    )
