"""Overload: a flood of AssembleContext is shed with RESOURCE_EXHAUSTED and a retry hint while the health
check and cheap calls keep answering; the client retries shed calls after the hint.

Conditions, not timings: the gate's limit is small (2 assemblies, no queue) so a burst of 40 concurrent
assemblies must exceed it whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import memlane
from memlane import Message, Role
from memlane_server.background import SidecarThread
from tests.conftest import ServerFactory

LIMITS = {"admission_limits": "AssembleContext=2,*=64", "admission_max_queue": 0, "admission_max_wait_ms": 0}


@pytest.fixture(scope="module")
def gated(start_server: ServerFactory) -> SidecarThread:
    return start_server(**LIMITS)


def _session(target: str) -> str:
    with memlane.Client(target, timeout=30) as c:
        sid = c.create_session(user_id="u-overload").session.session_id
        c.append_messages(
            session_id=sid,
            messages=[
                Message(
                    role=Role.ROLE_USER if i % 2 == 0 else Role.ROLE_ASSISTANT,
                    content=f"turn {i} about order {i}",
                )
                for i in range(40)
            ],
        )
        return sid


async def _assemble(c: memlane.AsyncClient, sid: str) -> str:
    """ "ok", or the message of the RESOURCE_EXHAUSTED it was shed with."""
    try:
        async for _ in c.assemble_context(session_id=sid, user_input="where is my order?"):
            pass
        return "ok"
    except memlane.ResourceExhaustedError as exc:
        # Shedding says so in the structured details, with when to come back.
        assert exc.reason == "OVERLOADED" and exc.retryable, (exc.reason, exc)
        assert exc.retry_after is not None and exc.retry_after > 0
        return f"shed: {exc}"


def test_flood_is_shed_while_health_and_cheap_calls_answer(gated: SidecarThread) -> None:
    sid = _session(gated.target)
    admission = gated.sidecar.admission
    shed_before = admission.shed

    async def run() -> tuple[list[str], Any, Any]:
        async with (
            memlane.AsyncClient(gated.target, timeout=120, retry=memlane.NO_RETRY) as c,
            grpc.aio.insecure_channel(gated.target) as channel,
        ):
            flood = [asyncio.create_task(_assemble(c, sid)) for _ in range(40)]
            # Once shedding has begun (the server is over its limit), the cheap paths must still answer.
            for first in asyncio.as_completed(flood):
                if (await first).startswith("shed"):
                    break
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=30
            )
            session = await c.get_session(session_id=sid)
            return list(await asyncio.gather(*flood)), health, session

    results, health, session = asyncio.run(run())
    shed = [r for r in results if r.startswith("shed")]
    assert len(shed) >= 1 and results.count("ok") >= 2, results  # shed, and the admitted ones served
    assert len(shed) + results.count("ok") == len(results)  # nothing failed in any other way
    assert all("retry after" in r for r in shed)
    assert admission.shed - shed_before == len(shed)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert session.session.session_id == sid


def test_client_retries_shed_calls_after_the_hint(gated: SidecarThread) -> None:
    sid = _session(gated.target)
    admission = gated.sidecar.admission
    shed_before = admission.shed
    patient = memlane.RetryPolicy(max_attempts=50)

    async def run() -> list[str]:
        async with memlane.AsyncClient(gated.target, timeout=120, retry=patient) as c:
            return list(await asyncio.gather(*(_assemble(c, sid) for _ in range(12))))

    results = asyncio.run(run())
    assert admission.shed > shed_before  # calls were shed ...
    assert results == ["ok"] * 12  # ... and every one came back after its hint and was served
