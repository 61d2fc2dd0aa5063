"""The session-end job, metered from beside it: the job as a whole (``step="job"``) and its promote,
summarize and archive steps, each timed through the ``StepMeter`` it is given.

The meters live here, next to the job, so a job's walk stays inside pipelines/: the wrappers call only
their sibling steps and the meter handed to them (the sidecar hands its ``DomainMetrics``, whose
``step`` observes ``memlane_pipeline_step_*``), never a composition-level module above them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from ..sessions.model import ArchivePointer, Message, Session
from ..summarizers import Summarizer, SummaryResult
from .archive import ParquetArchive
from .archive_tables import ArchivePart
from .promote import Promoter
from .session_end import EndReport, SessionEndPipeline

T = TypeVar("T")


class StepMeter(Protocol):
    """Times one step: awaits ``call``, observing its duration and counting a failure if it raises."""

    async def step(self, name: str, call: Awaitable[T]) -> T: ...


class MeteredPromoter:
    def __init__(self, inner: Promoter, metrics: StepMeter) -> None:
        self._inner, self._metrics = inner, metrics

    async def promote(self, session: Session, messages: list[Message]) -> list[str]:
        return await self._metrics.step("promote", self._inner.promote(session, messages))


class MeteredStepSummarizer:
    """The session-end summarizer, timed as the pipeline's ``summarize`` step."""

    def __init__(self, inner: Summarizer, metrics: StepMeter) -> None:
        self._inner, self._metrics = inner, metrics

    @property
    def provider(self) -> str:
        return self._inner.provider

    async def summarize(self, previous: str, leaving: list[Message], budget_tokens: int) -> SummaryResult:
        return await self._metrics.step("summarize", self._inner.summarize(previous, leaving, budget_tokens))


class MeteredArchive(ParquetArchive):
    def __init__(self, uri: str, metrics: StepMeter) -> None:
        super().__init__(uri)
        self._metrics = metrics

    async def write(self, part: ArchivePart) -> ArchivePointer:
        return await self._metrics.step("archive", super().write(part))


class MeteredPipeline(SessionEndPipeline):
    """Times each queued job as a whole (``step="job"``)."""

    def __init__(self, *args: Any, metrics: StepMeter, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._metrics = metrics

    async def handle_job(
        self, session_id: str, reason: str, keep_job: Callable[[], Awaitable[None]]
    ) -> EndReport | None:
        return await self._metrics.step("job", super().handle_job(session_id, reason, keep_job))
