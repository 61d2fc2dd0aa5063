"""SearchMemories latency at 10k / 100k items (one user among many) and bulk promotion throughput.

Not a test: prints figures. Other users' rows carry random unit vectors (embedding 100k texts would
take minutes and their content does not matter to one user's prefiltered query); the measured user's
items and every query go through the real ONNX model. Each query text is distinct, so the query cache
never hits. Run: PYTHONPATH=server:client_py python benchmarks/bench_ltm.py [--sizes 10000,100000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import numpy as np

from memlane_server.bench.suite import filler
from memlane_server.config import Settings
from memlane_server.embedding import OnnxEmbedder, default_spec
from memlane_server.extraction import find_pii
from memlane_server.ltm import (
    LanceMemoryStore,
    MemoryService,
    NewMemory,
    Owner,
    RecallQuery,
    Visibility,
)
from memlane_server.wiring.stores import memory_tuning

TOPICS = [
    "hiking",
    "coffee",
    "Pune",
    "metric units",
    "Postgres",
    "cello",
    "SKU-4411-B",
    "vegan",
    "Kiwi",
    "chess",
]


async def run(size: int, embedder: OnnxEmbedder, queries: int) -> None:
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        store = await LanceMemoryStore.open(tmp, embedder.ndims)
        svc = MemoryService(
            store,
            embedder,
            memory_tuning(Settings().ltm),
            guard=find_pii,
            hot_index_mb=Settings().ltm.ltm_hot_index_mb,
        )
        users = max(1, size // 100)
        items = filler(size - 100, users, rng)
        for start in range(0, len(items), 20_000):
            await store.add(items[start : start + 20_000])
        owner = Owner("target", "agent")
        drafts = [NewMemory("fact", f"User fact {i}: likes {TOPICS[i % 10]} variant {i}") for i in range(100)]
        await svc.ingest(owner, drafts)
        t = time.perf_counter()
        await store.optimize()
        optimize_s = time.perf_counter() - t
        who = Visibility("target", "agent")
        for i in range(10):  # warm-up
            await svc.search(RecallQuery(who, f"warm up {i}", 10))
        lat = []
        for i in range(queries):
            q = f"what does the user think about {TOPICS[i % 10]} number {i}"
            t = time.perf_counter()
            await svc.search(RecallQuery(who, q, 10))
            lat.append((time.perf_counter() - t) * 1000)
        lat.sort()
        p50 = statistics.median(lat)
        p99 = lat[int(len(lat) * 0.99) - 1]
        # The embedding share of a search: the very texts the searches embedded, timed the same way
        # (one interactive call each) with the query cache emptied first, so each one is computed
        # again instead of served from the cache the searches just filled.
        embedder.forget_cached()
        emb = []
        for i in range(queries):
            q = f"what does the user think about {TOPICS[i % 10]} number {i}"
            t = time.perf_counter()
            await embedder.embed([q])
            emb.append((time.perf_counter() - t) * 1000)
        print(
            f"size={size:>7} users={users:>5} SearchMemories p50={p50:.1f} ms p99={p99:.1f} ms"
            f" (query embedding alone p50={statistics.median(emb):.1f} ms; optimize {optimize_s:.1f} s)"
        )
        await svc.close()
        store.close()


async def promotion(embedder: OnnxEmbedder, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await LanceMemoryStore.open(tmp, embedder.ndims)
        svc = MemoryService(
            store,
            embedder,
            memory_tuning(Settings().ltm),
            guard=find_pii,
            hot_index_mb=Settings().ltm.ltm_hot_index_mb,
        )
        t = time.perf_counter()
        for u in range(n // 50):
            drafts = [
                NewMemory(
                    "episodic",
                    f"[2024-05-0{1 + i % 9}] User: we talked about {TOPICS[i % 10]} plan {i}\n"
                    f"Assistant: noted the {TOPICS[(i + 3) % 10]} details for session {u}",
                )
                for i in range(50)
            ]
            await svc.ingest(Owner(f"u{u}", "agent", "", f"s{u}"), drafts)
        dt = time.perf_counter() - t
        print(f"bulk promotion: {n} episodic items in {dt:.1f} s = {n / dt:.0f} items/s (50 per session)")
        await svc.close()
        store.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--promote", type=int, default=1000)
    args = ap.parse_args()
    embedder = OnnxEmbedder.load(default_spec())
    for size in (int(s) for s in args.sizes.split(",")):
        await run(size, embedder, args.queries)
    await promotion(embedder, args.promote)
    await embedder.close()


if __name__ == "__main__":
    asyncio.run(main())
