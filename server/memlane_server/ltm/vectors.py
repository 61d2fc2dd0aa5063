"""Vectors a caller hands in or asks for: a query vector for SearchMemories (a framework that embeds on
its own, CrewAI, searches by vector) and the Embed RPC, both with the model memories are indexed with."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..embedding import Embedder
from ..errors import InvalidArgument

MAX_EMBED_TEXTS = 256  # texts per Embed call
MAX_EMBED_TEXT_BYTES = 64 * 1024  # the model reads its first few hundred tokens anyway


def query_vector(values: Sequence[float], ndims: int) -> npt.NDArray[np.float32] | None:
    """A caller's query vector, checked and L2-normalized (None when there is none)."""
    if not values:
        return None
    if len(values) != ndims:
        raise InvalidArgument(f"query_vector has {len(values)} values; the embedder's have {ndims}")
    v = np.asarray(values, dtype=np.float32)
    norm = float(np.linalg.norm(v)) if np.isfinite(v).all() else 0.0
    if not norm > 0.0 or not np.isfinite(norm):
        raise InvalidArgument("query_vector must be finite and not all zero")
    return v / norm


async def embed(embedder: Embedder, texts: Sequence[str]) -> npt.NDArray[np.float32]:
    check_texts(texts)
    return await embedder.embed(list(texts))


def check_texts(texts: Sequence[str]) -> None:
    """The Embed call's own bounds: texts present, at most ``MAX_EMBED_TEXTS``, each within its bytes."""
    if not texts:
        raise InvalidArgument("texts must not be empty")
    if len(texts) > MAX_EMBED_TEXTS:
        raise InvalidArgument(f"texts holds {len(texts)} entries; at most {MAX_EMBED_TEXTS}")
    for i, t in enumerate(texts):
        if len(t.encode("utf-8", "surrogatepass")) > MAX_EMBED_TEXT_BYTES:
            raise InvalidArgument(f"texts[{i}] is longer than {MAX_EMBED_TEXT_BYTES} bytes")
