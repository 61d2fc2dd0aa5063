"""The session-end meters (pipelines/metering.py) time each step under its own name through the meter
they are given; the sidecar's ``DomainMetrics`` is such a meter and keeps the metric names."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import pytest
from prometheus_client import CollectorRegistry

from memlane_server.observability.domain import DomainMetrics
from memlane_server.pipelines.metering import MeteredPromoter, MeteredStepSummarizer, StepMeter
from memlane_server.sessions.model import Message, Role, Session
from memlane_server.summarizers import SummaryResult

T = TypeVar("T")


class Steps:
    def __init__(self) -> None:
        self.names: list[str] = []

    async def step(self, name: str, call: Awaitable[T]) -> T:
        self.names.append(name)
        return await call


class Promoter:
    async def promote(self, session: Session, messages: list[Message]) -> list[str]:
        return [m.message_id for m in messages]


class Summarizer:
    @property
    def provider(self) -> str:
        return "fake"

    async def summarize(self, previous: str, leaving: list[Message], budget_tokens: int) -> SummaryResult:
        raise RuntimeError("model down")


def _turn() -> Message:
    return Message(message_id="m1", session_id="s", role=Role.USER, content="hi")


def test_each_step_is_timed_under_its_name_and_passes_its_result_through() -> None:
    steps = Steps()
    meter: StepMeter = steps
    promoted = asyncio.run(
        MeteredPromoter(Promoter(), meter).promote(Session(session_id="s", user_id="u"), [_turn()])
    )
    assert promoted == ["m1"]
    summarizer = MeteredStepSummarizer(Summarizer(), meter)
    assert summarizer.provider == "fake"
    with pytest.raises(RuntimeError):
        asyncio.run(summarizer.summarize("", [_turn()], 10))
    assert steps.names == ["promote", "summarize"]


def test_the_sidecars_domain_metrics_meter_a_step_and_its_failure() -> None:
    registry = CollectorRegistry()
    summarizer = MeteredStepSummarizer(Summarizer(), DomainMetrics(registry))
    with pytest.raises(RuntimeError):
        asyncio.run(summarizer.summarize("", [], 10))
    labels = {"step": "summarize"}
    assert registry.get_sample_value("memlane_pipeline_step_failures_total", labels) == 1
    assert registry.get_sample_value("memlane_pipeline_step_duration_seconds_count", labels) == 1
