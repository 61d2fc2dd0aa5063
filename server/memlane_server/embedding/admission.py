"""Embedding work that callers ask for, bounded: a cost limit per call and a limit on the work in flight.

``Embed``, ``CreateMemory``, ``UpdateMemory`` and ``ExtractMemories`` embed text a caller sends; a caller
could otherwise hold the model for a minute with one call (250 texts of 63 KB) or keep it busy with a
stream of them. Their cost is counted in the tokens the model will read: each text is cut to the
model's sequence length before it is tokenized (``onnx.CHARS_PER_TOKEN``), so a text costs at most
``max_length`` tokens, and about a quarter of its characters below that. A call over ``max_call_tokens``
is refused at once, before any work; a call that would take the work in flight over
``max_inflight_tokens`` waits for room as long as a call waits at its admission gate
(``admission_max_wait_ms``), then is refused with a retry hint. Both name the limit.
The background's own embedding (session end, learning) is not counted: it is the sidecar's, and waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import NoReturn

from ..errors import ResourceExhausted
from .onnx import CHARS_PER_TOKEN

# English averages about four characters a token; the estimate only has to rank calls by cost.
_CHARS_PER_TOKEN_ESTIMATE = 4
_SPECIAL_TOKENS = 2  # [CLS] and [SEP]


class EmbeddingBusy(ResourceExhausted):
    """The embedding work in flight is at its limit; ``retry_after_ms`` says when to try again."""

    reason = "EMBEDDING_BUSY"

    def __init__(self, message: str, *, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


def embedding_cost(texts: Sequence[str], max_length: int) -> int:
    """Tokens the model will read for ``texts``, estimated from their characters after the cut."""
    cut = max_length * CHARS_PER_TOKEN
    return sum(
        min(max_length, min(len(t), cut) // _CHARS_PER_TOKEN_ESTIMATE + _SPECIAL_TOKENS) for t in texts
    )


class EmbeddingAdmission:
    def __init__(
        self, *, max_length: int, max_call_tokens: int, max_inflight_tokens: int, max_wait_s: float = 0.1
    ) -> None:
        self._max_length = max_length
        self.max_call_tokens = max_call_tokens
        self.max_inflight_tokens = max(max_inflight_tokens, max_call_tokens)
        self._max_wait_s = max_wait_s
        self.inflight = 0
        self._room = asyncio.Condition()
        self._tokens_per_s = 2000.0  # refined by what calls take; only the retry hint uses it

    def _refuse(self) -> NoReturn:
        hint = int(1000 * self.inflight / self._tokens_per_s) + 1
        raise EmbeddingBusy(
            f"the sidecar is embedding {self.inflight} tokens for callers, its limit"
            f" (embedding_max_inflight_tokens {self.max_inflight_tokens}); retry in {hint} ms",
            retry_after_ms=hint,
        )

    @contextlib.asynccontextmanager
    async def admit(self, texts: Sequence[str], field: str) -> AsyncIterator[None]:
        """Hold room for ``texts`` while the body embeds them, or raise ``ResourceExhausted``."""
        cost = embedding_cost(texts, self._max_length)
        if cost > self.max_call_tokens:
            raise ResourceExhausted(
                f"{field}: {len(texts)} texts cost about {cost} tokens to embed; a call may cost at most"
                f" {self.max_call_tokens} (embedding_max_call_tokens): send fewer or shorter texts per call",
                field=field,
                reason="EMBEDDING_TOO_LARGE",
            )
        async with self._room:
            if self.inflight + cost > self.max_inflight_tokens:
                if self._max_wait_s <= 0:
                    self._refuse()
                try:
                    await asyncio.wait_for(
                        self._room.wait_for(lambda: self.inflight + cost <= self.max_inflight_tokens),
                        self._max_wait_s,
                    )
                except TimeoutError:
                    self._refuse()
            self.inflight += cost
        started = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - started
            if cost and took > 0:
                self._tokens_per_s = 0.8 * self._tokens_per_s + 0.2 * max(cost / took, 100.0)
            async with self._room:
                self.inflight -= cost
                self._room.notify_all()
