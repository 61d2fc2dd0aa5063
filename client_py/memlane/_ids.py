"""Time-sortable ids (ULID layout, Crockford base32). The client assigns them to messages and sessions
that have none, so every write it sends can be retried without creating a duplicate."""

from __future__ import annotations

import os
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_lock = threading.Lock()
_last_ms = 0
_last_rand = 0


def _b32(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_id() -> str:
    """A 26-character id that sorts after every id this process made before."""
    global _last_ms, _last_rand
    with _lock:
        now = time.time_ns() // 1_000_000
        if now <= _last_ms:
            now = _last_ms
            _last_rand += 1
        else:
            _last_ms = now
            _last_rand = int.from_bytes(os.urandom(10), "big") >> 1  # leaves room to increment
        rand = _last_rand
    return _b32(now, 10) + _b32(rand & ((1 << 80) - 1), 16)
