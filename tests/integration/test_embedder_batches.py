"""The embedder's batches and lanes: bulk work of several callers shares a model run; queries have a
thread of their own, so a query never waits behind bulk work; bulk threads run at a lower priority."""

from __future__ import annotations

import asyncio
import os
import threading

import numpy as np
import numpy.typing as npt
import pytest

from memlane_server.embedding import OnnxEmbedder, default_spec
from memlane_server.embedding.onnx import BULK_NICENESS


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


class Gated(OnnxEmbedder):
    """The real model, whose bulk runs wait at a gate the test opens (queries run as usual)."""

    gate = threading.Event()
    bulk_running = threading.Event()

    def _run(self, texts: list[str]) -> npt.NDArray[np.float32]:
        if threading.current_thread().name.startswith("memlane-embed-bulk"):
            self.bulk_running.set()
            self.gate.wait(timeout=120)
        return super()._run(texts)


async def test_a_query_never_waits_behind_bulk_work() -> None:
    model = Gated.load(default_spec(), bulk_threads=1)
    assert isinstance(model, Gated)
    Gated.gate.clear()
    Gated.bulk_running.clear()
    bulk = asyncio.ensure_future(model.embed([f"episode {i}: the invoice is INV-{i}" for i in range(40)]))
    await asyncio.to_thread(Gated.bulk_running.wait, 60)  # the bulk lane's only thread is held
    query = await asyncio.wait_for(model.embed(["where do I live?"]), 60)  # answered meanwhile
    assert query.shape == (1, model.ndims) and not bulk.done()
    Gated.gate.set()
    vectors = await bulk
    # Positive control: the held work finishes, and a text's vector is the same in either lane.
    again = await model.embed(["episode 0: the invoice is INV-0"])
    np.testing.assert_array_equal(vectors[0], again[0])
    await model.close()


async def test_bulk_threads_run_at_a_lower_priority() -> None:
    model = OnnxEmbedder.load(default_spec(), bulk_threads=2)
    seen: dict[str, int] = {}

    def nice_of_this_thread() -> None:
        seen[threading.current_thread().name] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    loop = asyncio.get_running_loop()
    await loop.run_in_executor(model._bulk.executor, nice_of_this_thread)
    await loop.run_in_executor(model._query.executor, nice_of_this_thread)
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    bulk = [n for name, n in seen.items() if name.startswith("memlane-embed-bulk")]
    query = [n for name, n in seen.items() if name.startswith("memlane-embed-query")]
    assert bulk == [min(19, mine + BULK_NICENESS)] and query == [mine]
    await model.close()
