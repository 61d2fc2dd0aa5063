"""Fixtures for long-term memory tests: one real ONNX embedder per run, a real LanceDB per test.

Import the fixtures into a test module (``from tests.ltm_fixtures import embedder, memory``) so
pytest registers them there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from memlane_server.config import Settings
from memlane_server.embedding import OnnxEmbedder, default_spec
from memlane_server.extraction import find_pii
from memlane_server.ltm import LanceMemoryStore, MemoryService, MemoryTuning
from memlane_server.wiring.stores import memory_tuning

HOT_MB = Settings().ltm.ltm_hot_index_mb


@pytest_asyncio.fixture(scope="session")
async def embedder() -> AsyncIterator[OnnxEmbedder]:
    emb = OnnxEmbedder.load(default_spec())
    yield emb
    await emb.close()


async def open_memory(
    path: Path,
    embedder: OnnxEmbedder,
    policy: MemoryTuning | None = None,
    *,
    clock: Callable[[], int] | None = None,
) -> MemoryService:
    store = await LanceMemoryStore.open(str(path), embedder.ndims)
    if clock is None:
        return MemoryService(
            store, embedder, policy or memory_tuning(Settings().ltm), guard=find_pii, hot_index_mb=HOT_MB
        )
    return MemoryService(
        store,
        embedder,
        policy or memory_tuning(Settings().ltm),
        guard=find_pii,
        clock=clock,
        hot_index_mb=HOT_MB,
    )


@pytest_asyncio.fixture
async def memory(tmp_path: Path, embedder: OnnxEmbedder) -> AsyncIterator[MemoryService]:
    svc = await open_memory(tmp_path / "ltm", embedder)
    yield svc
    await svc.close()
    svc.store.close()


__all__ = ["embedder", "memory", "open_memory", "pytest"]
