"""Time-sortable ids (ULID layout, Crockford base32). The client assigns them to messages and sessions
that have none, so every write it sends can be retried without creating a duplicate."""

from __future__ import annotations

import os
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


class _Clock:
    """Millisecond time plus an 80-bit counter that starts random each millisecond and increments
    within it, so ids made in one process sort in creation order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ms = 0
        self._rand = 0

    def tick(self) -> tuple[int, int]:
        with self._lock:
            now = time.time_ns() // 1_000_000
            if now <= self._ms:
                self._rand += 1
            else:
                self._ms = now
                self._rand = int.from_bytes(os.urandom(10), "big") >> 1  # leaves room to increment
            return self._ms, self._rand


_clock = _Clock()


def _b32(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_id() -> str:
    """A 26-character id that sorts after every id this process made before."""
    ms, rand = _clock.tick()
    return _b32(ms, 10) + _b32(rand & ((1 << 80) - 1), 16)
