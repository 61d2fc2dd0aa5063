"""The embedder's batches: bulk work of several callers shares a model run, and queries go first."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from memlane_server.embedding import OnnxEmbedder, default_spec


@pytest.fixture()
def recording() -> OnnxEmbedder:
    """A real model whose runs are recorded (how many texts each run got)."""
    model = OnnxEmbedder.load(default_spec(), batch_size=32)
    runs: list[int] = []
    real = model._run

    def run(texts: list[str]) -> np.ndarray:  # type: ignore[type-arg]
        runs.append(len(texts))
        return real(texts)

    model._run = run  # type: ignore[method-assign]
    model.runs = runs  # type: ignore[attr-defined]
    return model


async def test_bulk_chunks_of_two_callers_share_one_run(recording: OnnxEmbedder) -> None:
    a = [f"session a, turn {i}: I keep my bike in locker {i}" for i in range(10)]
    b = [f"session b, turn {i}: the invoice number is INV-{i}" for i in range(12)]
    c = ["x " * 200] * 6
    va, vb, _ = await asyncio.gather(recording.embed(a), recording.embed(b), recording.embed(c))
    assert recording.runs == [len(a) + len(b) + len(c)]  # one run for the three callers ...
    # ... and each caller still gets its own vectors, in order (positive control: embedded alone).
    alone = await recording.embed(a[:5])
    np.testing.assert_allclose(va[:5], alone, atol=1e-5)
    assert va.shape == (10, recording.ndims) and vb.shape == (12, recording.ndims)
    await recording.close()


async def test_a_batch_never_grows_past_the_batch_size(recording: OnnxEmbedder) -> None:
    texts = [[f"caller {k} text {i}" for i in range(20)] for k in range(3)]
    await asyncio.gather(*(recording.embed(t) for t in texts))
    assert sorted(recording.runs) == [20, 20, 20]  # two callers' 20 would make 40: over the size
    await recording.close()
