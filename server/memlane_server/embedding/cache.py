"""A small LRU cache of text -> vector, so repeated query texts skip the model."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import numpy.typing as npt


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
