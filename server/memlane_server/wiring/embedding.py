"""The embedding model from its settings: which file, which maths. Apart from ``wiring/stores.py`` so that
the model process (``children.py``) imports the model's libraries and nothing else of the sidecar."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ..config import EmbeddingSettings
from ..embedding import OnnxEmbedder, OnnxModelSpec, Pooling, int8_spec, packaged_spec


def embedding_spec(s: EmbeddingSettings) -> OnnxModelSpec:
    """The configured model with the configured maths. Blocking: the first start on a machine converts
    the model to int8 (seconds; cached after, see embedding/spec.py)."""
    base = packaged_spec()
    spec = base
    if s.embedding_model_path:
        spec = OnnxModelSpec(
            model_path=Path(s.embedding_model_path),
            tokenizer_path=Path(s.embedding_tokenizer_path)
            if s.embedding_tokenizer_path
            else base.tokenizer_path,
            ndims=s.embedding_dims,
            pooling=Pooling(s.embedding_pooling),
            sha256=s.embedding_sha256,
        )
    int8 = s.embedding_maths == "int8" or (s.embedding_maths == "auto" and not s.embedding_model_path)
    if not int8:
        return spec
    return int8_spec(spec, Path(s.embedding_cache_dir) if s.embedding_cache_dir else None)


async def load_embedder(s: EmbeddingSettings) -> OnnxEmbedder:
    def load() -> OnnxEmbedder:
        return OnnxEmbedder.load(embedding_spec(s), bulk_threads=s.embedding_threads)

    return await asyncio.to_thread(load)
