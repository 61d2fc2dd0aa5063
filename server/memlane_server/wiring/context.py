"""Context assembly: the assembler over the stores, long-term memory and the summary scheduler."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..config import ContextSettings
from ..context import ContextAssembler, MemorySource, SummaryScheduler, TraceStore, policy_from_settings
from ..pipelines import Resumer
from ..sessions.ending import SessionEndQueue
from ..sessions.model import PolicyBook
from ..summarizers import Summarizer
from ..tokens import TokenCounter
from .stores import Stores


def build_context(
    c: ContextSettings,
    stores: Stores,
    tokens: TokenCounter,
    *,
    summarizer: Summarizer | None,
    memory: MemorySource | None,
    default_model: str,
    executor: ThreadPoolExecutor,
    resumer: Resumer,
    policies: PolicyBook,
    queue: SessionEndQueue,
) -> ContextAssembler:
    # The summaries themselves are written by a worker (wiring/lifecycle.py: SummaryWriter).
    scheduler = SummaryScheduler(queue) if summarizer is not None else None
    return ContextAssembler(
        stores.sessions,
        TraceStore(stores.traces),
        tokens,
        memory=memory,
        scheduler=scheduler,
        policy=policy_from_settings(c),
        system_prompt=c.context_system_prompt,
        default_model=default_model,
        max_summary_tokens=c.summary_max_tokens,
        executor=executor,
        resume=resumer.resume_if_retired,
        policies=policies,
        procedures=stores.procedures,
        procedures_max_tokens=c.context_procedures_max_tokens,
    )
