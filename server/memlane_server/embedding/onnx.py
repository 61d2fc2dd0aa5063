"""``OnnxEmbedder``: ONNX Runtime on one worker thread, with micro-batching and a query cache.

Concurrent ``embed`` calls are coalesced: while the model runs one batch, later callers queue up and
run together in the next batch, so throughput rises under load without adding latency when idle.
Small (query-sized) calls go ahead of bulk chunks, so a session-end promotion of hundreds of texts
delays a recall query by at most one chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Tokenizer

from .cache import VectorCache
from .spec import EmbeddingModelError, OnnxModelSpec, Pooling, verify_files

# Calls with at most this many texts count as interactive (recall queries) and are cached/prioritized.
_INTERACTIVE_MAX_TEXTS = 4


@dataclass(slots=True)
class _Job:
    texts: list[str]
    future: asyncio.Future[npt.NDArray[np.float32]] = field(repr=False)


# Characters kept per token of the model's sequence length (see OnnxEmbedder._run).
CHARS_PER_TOKEN = 8


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
    ) -> None:
        self._spec = spec
        self._session = session
        self._tokenizer = tokenizer
        self._input_names = {i.name for i in session.get_inputs()}
        self._output_name = spec.output_name or session.get_outputs()[0].name
        self._batch_size = batch_size
        self._cache = VectorCache(cache_size)
        # One worker: the model already uses the cores through intra-op threads, and a single worker
        # keeps batches in order and memory bounded.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memlane-embed")
        self._interactive: deque[_Job] = deque()
        self._bulk: deque[_Job] = deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    def load(
        cls, spec: OnnxModelSpec, *, intra_op_threads: int = 2, batch_size: int = 32, cache_size: int = 1024
    ) -> OnnxEmbedder:
        """Verify the files, open the ONNX session and tokenizer. Blocking (about 0.3 s): call at startup."""
        verify_files(spec)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # No CPU arena: it keeps the peak of the largest batch ever run (a 32 x 256 batch leaves the
        # process 1.3 GB bigger for good); without it memory returns after each batch, at no
        # measurable cost in speed for a model this small.
        opts.enable_cpu_mem_arena = False
        opts.enable_mem_pattern = False
        # Threads that finish a run sleep instead of spinning for the next one: the cores are shared with
        # the event loop (and a worker process), and a spinning thread takes a core from them between
        # queries for nothing.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
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
        embedder = cls(spec, session, tokenizer, batch_size=batch_size, cache_size=cache_size)
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

    @property
    def cache(self) -> VectorCache:
        return self._cache

    def forget_cached(self) -> None:
        self._cache.clear()

    async def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        if self._closed:
            raise RuntimeError("embedder is closed")
        if not texts:
            return np.zeros((0, self.ndims), dtype=np.float32)
        if len(texts) <= _INTERACTIVE_MAX_TEXTS:
            return await self._embed_interactive(texts)
        chunks = [texts[i : i + self._batch_size] for i in range(0, len(texts), self._batch_size)]
        futures = [self._submit(chunk, bulk=True) for chunk in chunks]
        parts = await asyncio.gather(*futures)
        return np.concatenate(parts, axis=0)

    async def _embed_interactive(self, texts: list[str]) -> npt.NDArray[np.float32]:
        out = np.empty((len(texts), self.ndims), dtype=np.float32)
        missing: list[int] = []
        for i, text in enumerate(texts):
            cached = self._cache.get(text)
            if cached is None:
                missing.append(i)
            else:
                out[i] = cached
        if missing:
            fresh = await self._submit([texts[i] for i in missing], bulk=False)
            for row, i in enumerate(missing):
                out[i] = fresh[row]
                self._cache.put(texts[i], fresh[row].copy())
        return out

    def _submit(self, texts: list[str], *, bulk: bool) -> asyncio.Future[npt.NDArray[np.float32]]:
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._work(), name="memlane-embed-batcher")
        job = _Job(texts, loop.create_future())
        (self._bulk if bulk else self._interactive).append(job)
        assert self._wakeup is not None
        self._wakeup.set()
        return job.future

    def _next_batch(self) -> list[_Job]:
        """Queued interactive jobs up to one batch; else bulk jobs up to one batch. Bulk jobs of
        different callers (a worker ending two sessions at once, each with a short last chunk) share a
        batch, so the model runs full batches."""
        queue = self._interactive or self._bulk
        if not queue:
            return []
        jobs = [queue.popleft()]
        size = len(jobs[0].texts)
        while queue and size + len(queue[0].texts) <= self._batch_size:
            job = queue.popleft()
            size += len(job.texts)
            jobs.append(job)
        return jobs

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while jobs := self._next_batch():
                jobs = [j for j in jobs if not j.future.cancelled()]
                if not jobs:
                    continue
                texts = [t for j in jobs for t in j.texts]
                try:
                    vectors = await loop.run_in_executor(self._executor, self._run, texts)
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
        step = self._batch_size
        for start in range(0, len(order), step):
            idx = order[start : start + step]
            out[idx] = self._infer([texts[i] for i in idx])
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
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        for queue in (self._interactive, self._bulk):
            while queue:
                job = queue.popleft()
                if not job.future.done():
                    job.future.set_exception(RuntimeError("embedder is closed"))
        self._executor.shutdown(wait=True)
