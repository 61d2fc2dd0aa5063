"""Several sidecars on one LanceDB table (on S3, or a shared disk): commit conflicts are retried, stale
reads re-read the latest version, and the operations that rewrite other users' rows are serialized.

What happens without this, measured with three processes on one table (docs/reliability.md, "Object
storage"): LanceDB commits a version with a conditional put of its manifest and rebases compatible
commits itself (appends on appends), but a compaction preempted by a concurrent update, an index build
preempted by a compaction, or a writer that lost too many rounds fail with "Retryable commit conflict"
/ "Too many concurrent writers" errors; and a handle still on a version that another sidecar's erasure
cleaned up (``cleanup_older_than=0``) fails every read with "Not found" for the files it removed.

Serialized (``TableLock``): compaction, index builds and erasure. Erasure must not run beside another
sidecar's compaction: a compaction that read a fragment before the erasure's delete copies the erased
rows into a new fragment (or an orphan file, if its commit then loses), where no delete reaches them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..errors import DataLoss, Unavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

# LanceDB raises these as RuntimeError (sometimes OSError/ValueError) with the Rust error's text.
_CONFLICT = re.compile(r"commit conflict|too many concurrent writers|preempted by concurrent", re.IGNORECASE)
_STALE = re.compile(r"\bnot found\b", re.IGNORECASE)
# The object store did not answer (paused, down, unreachable): UNAVAILABLE, which clients retry, not
# INTERNAL. LanceDB has then already retried the request for a while (object_store's retry policy).
# What LanceDB says when a file's bytes are not what its manifest promised (measured: a data file cut
# short, or one overwritten with other bytes).
_DAMAGED = re.compile(
    r"failed to fill whole buffer|does not appear to be a Lance file|invalid magic|corrupt", re.IGNORECASE
)
_IO = re.compile(r"LanceError\(IO\)|error sending request|timed out|connection refused", re.IGNORECASE)
LANCE_ERRORS = (RuntimeError, OSError, ValueError)


class TableLock(Protocol):
    """One holder at a time across every sidecar sharing the table."""

    def hold(self, wait_s: float) -> AbstractAsyncContextManager[bool]:
        """Yields True while held; False (not held) if another holder kept it for ``wait_s``."""
        ...


class LocalTableLock:
    """The lock of a table no other process writes (tests, tools); app.py passes a Redis one."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def hold(self, wait_s: float) -> AsyncIterator[bool]:
        if self._lock.locked() and wait_s <= 0:
            yield False
            return
        try:  # not wait_for: on 3.11 it can swallow a cancel landing as the lock is granted
            async with asyncio.timeout(wait_s if wait_s > 0 else None):
                await self._lock.acquire()
        except TimeoutError:
            yield False
            return
        try:
            yield True
        finally:
            self._lock.release()


@dataclass(slots=True)
class Contention:
    """What sharing cost this handle so far (logged, and read by the measurement)."""

    conflicts_retried: int = 0  # writes that lost a commit race and were run again
    stale_reads_retried: int = 0  # reads that found their version cleaned up and re-read the latest
    skipped_busy: int = 0  # compactions/index builds left to the sidecar already running one


def is_conflict(exc: BaseException) -> bool:
    return _CONFLICT.search(str(exc)) is not None


def is_stale(exc: BaseException) -> bool:
    return _STALE.search(str(exc)) is not None


def unreachable(exc: BaseException) -> BaseException:
    """What a failed LanceDB call becomes (raise it ``from exc``): ``DataLoss`` for a damaged table file
    (a retry would meet it again: an operator restores the table), ``Unavailable`` for an object store
    or disk that did not answer, ``exc`` itself otherwise."""
    text = str(exc)
    if _DAMAGED.search(text) is not None:
        return DataLoss(
            "the long-term memory table is damaged (a data file is truncated or overwritten): restore the"
            f" table directory from a backup, or move it aside to start empty ({text[:200]})"
        )
    if _IO.search(text) is None:
        return exc
    return Unavailable(f"the memory store did not answer: {text[:300]}")


async def retry_write(
    call: Callable[[], Awaitable[T]],
    *,
    refresh: Callable[[], Awaitable[None]],
    stats: Contention,
    what: str,
    attempts: int = 8,
    base_s: float = 0.05,
) -> T:
    """Runs ``call`` again, on the latest version, after a failure that happened before its commit: a
    conflict (the commit was refused) or a stale version (it failed reading). Jittered exponential
    backoff, so N sidecars that collided do not collide again in lockstep (~13 s in all at most)."""
    for attempt in range(attempts):
        try:
            return await call()
        except LANCE_ERRORS as exc:
            if attempt == attempts - 1 or not (is_conflict(exc) or is_stale(exc)):
                raise unreachable(exc) from exc
            stats.conflicts_retried += 1
            log.info("LTM %s: %s; retrying on the latest version (%d)", what, str(exc)[:160], attempt + 1)
        await refresh()
        await asyncio.sleep(base_s * (2**attempt) * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")  # pragma: no cover


async def retry_read(
    call: Callable[[], Awaitable[T]], *, refresh: Callable[[], Awaitable[None]], stats: Contention
) -> T:
    """Runs a read again on the latest version if its version's files were cleaned up under it."""
    try:
        return await call()
    except LANCE_ERRORS as exc:
        if not is_stale(exc):
            raise unreachable(exc) from exc
        stats.stale_reads_retried += 1
        log.info("LTM read on a cleaned-up version (%s); re-reading the latest", str(exc)[:160])
    try:
        await refresh()
        return await call()
    except LANCE_ERRORS as exc:
        raise unreachable(exc) from exc
