"""Token counting with offline tiktoken encodings, chosen by model name."""

from __future__ import annotations

import tiktoken

from .encodings import ENCODINGS, EncodingUnavailable, load_encoding
from .models import DEFAULT_ENCODING, context_window_for_model, encoding_for_model

__all__ = [
    "DEFAULT_ENCODING",
    "ENCODINGS",
    "EncodingUnavailable",
    "TokenCounter",
    "context_window_for_model",
    "encoding_for_model",
]

# Chat formats add a few tokens per message for the role and separators (OpenAI's cookbook: 3 + 1 for
# a name); assembly budgets with this so what we count matches what the provider bills.
MESSAGE_OVERHEAD_TOKENS = 4


class TokenCounter:
    """Counts tokens for models. Encodings load lazily and are shared process-wide."""

    def __init__(self, default_encoding: str = DEFAULT_ENCODING, *, preload: bool = True) -> None:
        """``preload``: build the default encoding now (fail at start, not on the first request). A
        process that counts tokens only now and then (a worker process) leaves it to the first count:
        a built encoding holds about 50 MB."""
        self.default_encoding = default_encoding
        if preload:
            load_encoding(default_encoding)

    def encoding(self, model: str = "") -> tiktoken.Encoding:
        return load_encoding(encoding_for_model(model, self.default_encoding))

    def count(self, text: str, model: str = "") -> int:
        if not text:
            return 0
        # encode_ordinary counts "<|endoftext|>" in user text as plain text instead of raising.
        return len(self.encoding(model).encode_ordinary(text))

    def count_many(self, texts: list[str], model: str = "") -> list[int]:
        # Not encode_batch: it spins up a thread pool per call, which costs more than short texts do.
        enc = self.encoding(model)
        return [len(enc.encode_ordinary(t)) for t in texts]

    def truncate(self, text: str, max_tokens: int, model: str = "") -> str:
        """The longest prefix of ``text`` that fits in ``max_tokens``."""
        enc = self.encoding(model)
        ids = enc.encode_ordinary(text)
        return text if len(ids) <= max_tokens else enc.decode(ids[: max(0, max_tokens)])
