"""The query cache of the embedding model (embedding/onnx.py ``VectorCache``): least recently used
text goes first, a read counts as a use, cached rows cannot be written through, capacity 0 caches
nothing. No model is loaded."""

from __future__ import annotations

import numpy as np
import pytest

from memlane_server.embedding.onnx import VectorCache


def _vec(x: float) -> np.ndarray:
    return np.full(3, x, dtype=np.float32)


def test_the_least_recently_used_text_is_evicted() -> None:
    cache = VectorCache(2)
    cache.put("a", _vec(1))
    cache.put("b", _vec(2))
    assert cache.get("a") is not None  # "a" is now the most recent
    cache.put("c", _vec(3))
    assert len(cache) == 2
    assert cache.get("b") is None
    assert cache.get("a") is not None and cache.get("c") is not None
    assert (cache.hits, cache.misses) == (3, 1)


def test_cached_rows_are_read_only() -> None:
    cache = VectorCache(1)
    cache.put("a", _vec(1))
    row = cache.get("a")
    assert row is not None
    with pytest.raises(ValueError):
        row[0] = 9.0


def test_capacity_zero_caches_nothing_and_clear_empties() -> None:
    none = VectorCache(0)
    none.put("a", _vec(1))
    assert len(none) == 0 and none.get("a") is None
    cache = VectorCache(4)
    cache.put("a", _vec(1))
    cache.clear()
    assert len(cache) == 0
