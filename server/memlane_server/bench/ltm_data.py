"""Synthetic long-term memory for benchmarks, written straight into a LanceDB directory before the
sidecar starts (embedding 100k texts would take many minutes and other users' content does not change
one user's prefiltered query). Vectors are random unit vectors; the measured queries still go through
the sidecar's real model."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from ..ltm import LanceMemoryStore, MemoryItem, MemoryKind, MemoryScope

TOPICS = ("hiking", "coffee", "Pune", "metric units", "Postgres", "cello", "SKU-4411-B", "vegan", "chess")
NDIMS = 384  # all-MiniLM-L6-v2, the default model


# The product caps non-episodic items at 200 per (user, agent) (ltm_max_items_per_agent); a user's
# other items are episodes. The synthetic data keeps to the same shape.
FACTS_PER_USER = 200


def items(user: str, n: int, rng: np.random.Generator, start: int = 0) -> list[MemoryItem]:
    vecs = rng.standard_normal((n, NDIMS)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    now = int(time.time() * 1000)
    return [
        MemoryItem(
            id=f"{user}-{start + i}",
            user_id=user,
            agent_id="bench-agent",
            scope=MemoryScope.USER,
            kind=MemoryKind.FACT if start + i < FACTS_PER_USER else MemoryKind.EPISODIC,
            content=f"{user} note {start + i}: about {TOPICS[i % len(TOPICS)]}, order {(start + i) * 7}",
            created_at_ms=now,
            updated_at_ms=now,
            occurred_at_ms=now,
            vector=vecs[i].tolist(),
        )
        for i in range(n)
    ]


def filler(n: int, users: int, rng: np.random.Generator, start: int = 0) -> list[MemoryItem]:
    """``n`` items spread over ``users`` other users (``filler0`` ...)."""
    rows = items("filler", n, rng, start)
    for j, row in enumerate(rows):
        row.user_id = f"filler{(start + j) % users}"
    return rows


async def _populate(uri: str, total: int, users: dict[str, int]) -> None:
    """``users`` items for each named user, and filler users up to ``total`` rows."""
    rng = np.random.default_rng(7)
    store = await LanceMemoryStore.open(uri, NDIMS)
    for user, n in users.items():
        await store.add(items(user, n, rng))
    rest, filler_users = total - sum(users.values()), max(1, total // 100)
    for start in range(0, rest, 20_000):
        await store.add(filler(min(20_000, rest - start), filler_users, rng, start))
    await store.optimize()
    store.close()


def populate(uri: str, total: int, users: dict[str, int]) -> None:
    asyncio.run(_populate(uri, total, users))
