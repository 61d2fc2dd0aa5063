"""The byte bound of every listing page (messages, sessions, memories, turn traces).

A page stops before it passes ``MAX_PAGE_BYTES`` (it always holds at least one item), well under the
16 MiB a client receives by default, whatever the items weigh; its page token then continues after the
last item it holds.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_PAGE_BYTES = 4 * 1024 * 1024


def fitting(costs: Iterable[int], limit: int = MAX_PAGE_BYTES) -> int:
    """How many leading items, of the given byte costs, one page holds (at least one, if any)."""
    taken = total = 0
    for cost in costs:
        if taken and total + cost > limit:
            break
        taken, total = taken + 1, total + cost
    return taken
