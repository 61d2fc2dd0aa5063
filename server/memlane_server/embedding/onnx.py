"""``OnnxEmbedder``: ONNX Runtime in two lanes over one set of weights, with micro-batching and a query cache
(``VectorCache``: repeated query texts skip the model).

Queries (calls of a few texts: recall, a single write) have a thread of their own at the process's CPU
priority; bulk work (session end, learning, ``Embed`` calls of many texts, a worker process's batches)
runs on ``bulk_threads`` threads at a lower priority (``BULK_NICENESS``). Both call the same
``InferenceSession`` (its ``run`` is thread-safe), each run on its calling thread alone
(``intra_op_num_threads`` 1: ONNX Runtime then starts no pool threads, whose priority would be the
creator's), so a query never waits behind a bulk batch and a bulk batch never takes a core from a request.

Concurrent calls of a lane are coalesced: while the model runs one batch, later callers queue up and run
together in the next batch, so throughput rises under load without adding latency when idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import weakref
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

# Tokenizing on the calling thread keeps a bulk batch's tokenizing at the bulk lane's priority (the
# library's own pool would run it at whatever priority its first caller had); it is also what makes a
# fork of this process safe. Set before the library reads it.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Tokenizer

from ..observability import spans
from .spec import EmbeddingModelError, OnnxModelSpec, Pooling, verify_files

# Calls with at most this many texts count as queries (recall, single writes): cached, own thread.
QUERY_MAX_TEXTS = 4
# Niceness added to the bulk threads (as for worker processes: a request's thread wins a contended core).
BULK_NICENESS = 10
# Padded tokens per model run: bounds the attention matrices of one run (heads x n x n floats per text)
# to a few tens of MB, whatever the batch; short texts still run 32 at a time.
_RUN_TOKENS = 4096


@dataclass(slots=True)
class _Job:
    texts: list[str]
    future: asyncio.Future[npt.NDArray[np.float32]] = field(repr=False)
    call: object = None  # the embed call it is a share of: shares of one call never share a batch


# Characters kept per token of the model's sequence length (see OnnxEmbedder._run).
CHARS_PER_TOKEN = 8


def runs_as_query(count: int, bulk: bool | None) -> bool:
    """Whether a call of ``count`` texts runs in the query lane: ``bulk`` None decides by size."""
    return count <= QUERY_MAX_TEXTS if bulk is None else not bulk


def _lower_priority() -> None:
    """Executor initializer: this thread (Linux schedules threads apart) at a lower CPU priority."""
    with contextlib.suppress(OSError, AttributeError):  # lowering a priority needs no privilege
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BULK_NICENESS))


class _Queue:
    """A lane's jobs of one event loop, and its consumers there. An embedder may serve several loops
    (the eval's baselines, tests' sidecars in threads): a future is only ever resolved on its own loop."""

    def __init__(self) -> None:
        self.jobs: deque[_Job] = deque()
        self.wakeup = asyncio.Event()
        self.consumers: list[asyncio.Task[None]] = []

    def take(self, batch_size: int) -> list[_Job]:
        """Queued jobs up to one batch. Jobs of different callers (a worker ending two sessions at once,
        each with a short last chunk) share a batch, so the model runs full batches; the shares of one
        call do not (``OnnxEmbedder.embed`` deals them to run side by side)."""
        jobs: list[_Job] = []
        calls: set[int] = set()
        size = 0
        while self.jobs and (
            not jobs or (size + len(self.jobs[0].texts) <= batch_size and id(self.jobs[0].call) not in calls)
        ):
            job = self.jobs.popleft()
            if job.call is not None:
                calls.add(id(job.call))
            if job.future.cancelled():
                continue
            size += len(job.texts)
            jobs.append(job)
        return jobs


class _Lane:
    """Jobs of one priority, run by ``threads`` consumers (per loop) on an executor of as many threads."""

    def __init__(self, name: str, threads: int, *, lower_priority: bool) -> None:
        self.name = name
        self.threads = threads
        self.executor = ThreadPoolExecutor(
            threads,
            thread_name_prefix=f"memlane-embed-{name}",
            initializer=_lower_priority if lower_priority else None,
        )
        self.queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Queue] = (
            weakref.WeakKeyDictionary()
        )
        self.texts = 0  # texts run so far (the memlane_embedding_texts metric)


class OnnxEmbedder:
    """Implements ``Embedder``. Build with ``OnnxEmbedder.load(spec)``; ``await close()`` at shutdown."""

    def __init__(
        self,
        spec: OnnxModelSpec,
        session: ort.InferenceSession,
        tokenizer: Tokenizer,
        *,
        batch_size: int = 32,
        cache_size: int = 1024,
        bulk_threads: int = 1,
    ) -> None:
        self._spec = spec
        self._session = session
        self._tokenizer = tokenizer
        self._input_names = {i.name for i in session.get_inputs()}
        self._output_name = spec.output_name or session.get_outputs()[0].name
        self._batch_size = batch_size
        self._cache = VectorCache(cache_size)
        self._query = _Lane("query", 1, lower_priority=False)
        self._bulk = _Lane("bulk", max(1, bulk_threads), lower_priority=True)
        self._closed = False

    @classmethod
    def load(
        cls, spec: OnnxModelSpec, *, bulk_threads: int = 1, batch_size: int = 32, cache_size: int = 1024
    ) -> OnnxEmbedder:
        """Verify the files, open the ONNX session and tokenizer. Blocking (about 0.3 s): call at startup."""
        verify_files(spec)
        opts = ort.SessionOptions()
        # Each run on its caller's thread alone (see the module's docstring): parallelism comes from the
        # lanes' threads running batches side by side.
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # No CPU arena: it keeps the peak of the largest batch ever run (a 32 x 256 batch leaves the
        # process 1.3 GB bigger for good); without it memory returns after each batch, at no
        # measurable cost in speed for a model this small.
        opts.enable_cpu_mem_arena = False
        opts.enable_mem_pattern = False
        try:
            session = ort.InferenceSession(str(spec.model_path), opts, providers=["CPUExecutionProvider"])
            tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
        except Exception as exc:  # onnxruntime and tokenizers raise their own untyped errors
            raise EmbeddingModelError(f"cannot load embedding model {spec.model_path}: {exc}") from exc
        # The shipped tokenizer.json pads every input to 128 and truncates there; pad per batch instead
        # (short queries run several times faster) and keep more context for long episodes.
        pad = tokenizer.padding or {}
        tokenizer.no_padding()
        tokenizer.enable_padding(
            pad_id=int(pad.get("pad_id", 0)), pad_token=str(pad.get("pad_token", "[PAD]"))
        )
        tokenizer.enable_truncation(max_length=spec.max_length)
        embedder = cls(
            spec, session, tokenizer, batch_size=batch_size, cache_size=cache_size, bulk_threads=bulk_threads
        )
        probe = embedder._run(["dimension probe"])
        if probe.shape != (1, spec.ndims):
            raise EmbeddingModelError(
                f"embedding model {spec.model_path} yields vectors of shape {probe.shape[1:]},"
                f" configured ndims is {spec.ndims}"
            )
        return embedder

    @property
    def ndims(self) -> int:
        return self._spec.ndims

    def texts_by_lane(self) -> dict[str, int]:
        return {lane.name: lane.texts for lane in (self._query, self._bulk)}

    @property
    def max_length(self) -> int:
        """Tokens the model reads of a text at most."""
        return self._spec.max_length

    @property
    def cache(self) -> VectorCache:
        return self._cache

    def forget_cached(self) -> None:
        self._cache.clear()

    async def embed(self, texts: list[str], *, bulk: bool | None = None) -> npt.NDArray[np.float32]:
        """``bulk`` None: a call of at most ``QUERY_MAX_TEXTS`` texts is a query, a larger one bulk work."""
        with spans.embedding_span(self._spec.model_path.stem, len(texts)):
            return await self._embed(texts, bulk)

    async def _embed(self, texts: list[str], bulk: bool | None) -> npt.NDArray[np.float32]:
        if self._closed:
            raise RuntimeError("embedder is closed")
        if not texts:
            return np.zeros((0, self.ndims), dtype=np.float32)
        if runs_as_query(len(texts), bulk):
            return await self._embed_query(texts)
        # Every thread of the lane gets a share: a session's 35 texts cut at the batch size would run
        # 32 on one thread and 3 on the other. Dealt in turn from the texts sorted by length, so the
        # shares cost alike and each holds texts of like length (little padding).
        n = -(-len(texts) // self._batch_size)  # batches needed
        shares = max(n, min(self._bulk.threads, len(texts)))
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        dealt = [order[k::shares] for k in range(shares)]
        call = object()
        parts = await asyncio.gather(
            *(self._submit(self._bulk, [texts[i] for i in idx], call) for idx in dealt)
        )
        out = np.empty((len(texts), self.ndims), dtype=np.float32)
        for idx, part in zip(dealt, parts, strict=True):
            out[idx] = part
        return out

    async def _embed_query(self, texts: list[str]) -> npt.NDArray[np.float32]:
        out = np.empty((len(texts), self.ndims), dtype=np.float32)
        missing: list[int] = []
        for i, text in enumerate(texts):
            cached = self._cache.get(text)
            if cached is None:
                missing.append(i)
            else:
                out[i] = cached
        if missing:
            fresh = await self._submit(self._query, [texts[i] for i in missing])
            for row, i in enumerate(missing):
                out[i] = fresh[row]
                self._cache.put(texts[i], fresh[row].copy())
        return out

    def _submit(
        self, lane: _Lane, texts: list[str], call: object = None
    ) -> asyncio.Future[npt.NDArray[np.float32]]:
        loop = asyncio.get_running_loop()
        queue = lane.queues.get(loop)
        if queue is None:
            lane.queues[loop] = queue = _Queue()
        queue.consumers = [t for t in queue.consumers if not t.done()]
        while len(queue.consumers) < lane.threads:
            task = loop.create_task(self._consume(lane, queue), name=f"memlane-embed-{lane.name}")
            queue.consumers.append(task)
        job = _Job(texts, loop.create_future(), call)
        queue.jobs.append(job)
        queue.wakeup.set()
        return job.future

    async def _consume(self, lane: _Lane, queue: _Queue) -> None:
        """One of the lane's consumers: takes a batch, runs it on the lane's executor, hands out rows."""
        loop = asyncio.get_running_loop()
        while True:
            jobs = queue.take(self._batch_size)
            if not jobs:
                queue.wakeup.clear()
                await queue.wakeup.wait()
                continue
            texts = [t for j in jobs for t in j.texts]
            lane.texts += len(texts)
            try:
                vectors = await loop.run_in_executor(lane.executor, self._run, texts)
            except Exception as exc:  # hand the model's failure to every waiting caller
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            start = 0
            for job in jobs:
                end = start + len(job.texts)
                if not job.future.done():
                    job.future.set_result(vectors[start:end])
                start = end

    def _run(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """Tokenize and infer one batch (worker thread). Sorting by length keeps padding small."""
        # The tokenizer reads a whole text before it truncates to max_length tokens: a 63 KB text cost
        # 2 s. A WordPiece token covers at least one character, and English averages under five per
        # token, so CHARS_PER_TOKEN characters per token hold every token the model reads (only runs
        # of words longer than that, which tokenize to [UNK], lose anything).
        limit = self._spec.max_length * CHARS_PER_TOKEN
        texts = [t[:limit] for t in texts]
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), self._spec.ndims), dtype=np.float32)
        if self._spec.runs_alone:
            for i, text in enumerate(texts):
                out[i] = self._infer([text])[0]
            return out
        # Runs of at most _RUN_TOKENS padded tokens (estimated from the longest text's characters) and
        # at most a batch of texts: short texts run many at a time, long ones a few.
        start = 0
        while start < len(order):
            longest = min(self._spec.max_length, len(texts[order[start]]) // 3 + 2)
            end = start + 1
            while end < len(order) and end - start < self._batch_size:
                longest = min(self._spec.max_length, max(longest, len(texts[order[end]]) // 3 + 2))
                if (end - start + 1) * longest > _RUN_TOKENS:
                    break
                end += 1
            idx = order[start:end]
            out[idx] = self._infer([texts[i] for i in idx])
            start = end
        return out

    def _infer(self, texts: list[str]) -> npt.NDArray[np.float32]:
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.asarray([e.ids for e in encodings], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encodings], dtype=np.int64)
        feeds: dict[str, npt.NDArray[np.int64]] = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        feeds = {k: v for k, v in feeds.items() if k in self._input_names}
        (hidden,) = self._session.run([self._output_name], feeds)
        hidden = np.asarray(hidden, dtype=np.float32)
        if self._spec.pooling is Pooling.NONE:
            pooled = hidden
        elif self._spec.pooling is Pooling.CLS:
            pooled = hidden[:, 0, :]
        else:
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: npt.NDArray[np.float32] = (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
        return result

    async def close(self) -> None:
        """Stops this loop's consumers (an embedder shared by several loops is closed by its owner's)."""
        self._closed = True
        loop = asyncio.get_running_loop()
        for lane in (self._query, self._bulk):
            queue = lane.queues.pop(loop, None)
            if queue is not None:
                for task in queue.consumers:
                    task.cancel()
                for task in queue.consumers:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                while queue.jobs:
                    job = queue.jobs.popleft()
                    if not job.future.done():
                        job.future.set_exception(RuntimeError("embedder is closed"))
            lane.executor.shutdown(wait=True)


# The query cache: a small LRU cache of text -> vector, so repeated query texts skip the model.


class VectorCache:
    """Bounded least-recently-used map. Single-threaded: only the event loop touches it."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: OrderedDict[str, npt.NDArray[np.float32]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, text: str) -> npt.NDArray[np.float32] | None:
        vec = self._items.get(text)
        if vec is None:
            self.misses += 1
            return None
        self._items.move_to_end(text)
        self.hits += 1
        return vec

    def put(self, text: str, vec: npt.NDArray[np.float32]) -> None:
        if self._capacity <= 0:
            return
        # Callers get views of cached rows; freezing them keeps one caller from corrupting another's.
        vec.setflags(write=False)
        self._items[text] = vec
        self._items.move_to_end(text)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
