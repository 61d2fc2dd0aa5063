"""MemlaneSaver against LangGraph's own conformance suite, through a real sidecar and Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from memlane.integrations.langgraph import MemlaneSaver
from memlane_server.background import SidecarThread


def test_memlane_saver_passes_every_conformance_capability(server: SidecarThread) -> None:
    @checkpointer_test(name="MemlaneSaver")
    async def memlane_checkpointer() -> AsyncGenerator[MemlaneSaver, None]:
        saver = MemlaneSaver(server.target, user_id="conformance")
        yield saver
        await saver.aclose()

    report = asyncio.run(validate(memlane_checkpointer))
    failures = {name: r.failures for name, r in report.results.items() if r.passed is not True}
    assert not failures, failures
    assert {name for name, r in report.results.items() if r.passed} == {c.value for c in ALL_CAPABILITIES}
    assert report.passed_all_base()
    assert report.to_dict()["conformance_level"] == "FULL"
