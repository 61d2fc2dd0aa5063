"""The embedder's batches: bulk work of several callers shares a model run, and queries go first."""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt
import pytest

from memlane_server.embedding import OnnxEmbedder, default_spec


class Recording(OnnxEmbedder):
    """The real model, recording how many texts each of its runs got."""

    runs: list[int] = []  # the probe run at load lands here; each test sets its own list

    def _run(self, texts: list[str]) -> npt.NDArray[np.float32]:
        self.runs.append(len(texts))
        return super()._run(texts)


@pytest.fixture()
def recording() -> Recording:
    model = Recording.load(default_spec(), batch_size=32)
    assert isinstance(model, Recording)
    model.runs = []
    return model


async def test_bulk_chunks_of_two_callers_share_one_run(recording: Recording) -> None:
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


async def test_a_batch_never_grows_past_the_batch_size(recording: Recording) -> None:
    texts = [[f"caller {k} text {i}" for i in range(20)] for k in range(3)]
    await asyncio.gather(*(recording.embed(t) for t in texts))
    assert sorted(recording.runs) == [20, 20, 20]  # two callers' 20 would make 40: over the size
    await recording.close()
