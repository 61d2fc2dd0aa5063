"""int8 maths for the embedding model, made once per machine and cached.

The packaged model stores int8 weights behind ``DequantizeLinear`` nodes, and ONNX Runtime folds those
into fp32 constants at load: +157 MB resident per process, and fp32 matrix products. ONNX Runtime's
dynamic quantization of the model's optimized fp32 graph (per-channel weights, QUInt8, ``reduce_range``
for CPUs without VNNI) keeps int8 weights in memory (+39 MB) and runs integer matrix products: a
one-text query in about half the time, 0.987 to 0.993 cosine to the fp32 vectors (LoCoMo recall in
docs/benchmarks.md). Per-tensor QInt8 was faster still but drifted to cosine 0.96.

The conversion needs the ``onnx`` package and a few seconds; it runs in a child process
(``int8_convert.py``), so neither onnx nor the fp32 graph ever stays in a sidecar's memory. The result
is cached under a name made of the source's sha256, this recipe and the ONNX Runtime version, with its
own sha256 beside it (checked at every load, like the packaged model's). Processes that start together
wait on one lock file and convert once. Each text runs alone (``OnnxModelSpec.runs_alone``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from .spec import EmbeddingModelError, OnnxModelSpec, file_sha256, packaged_spec

# Bump when the conversion changes: cached files of an older recipe are then made anew.
RECIPE = "dynamic-quint8-per-channel-reduce-range-v1"
_CONVERT_TIMEOUT_S = 300.0


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
    try:
        done = subprocess.run(
            [sys.executable, "-m", f"{__package__}.int8_convert", str(source.model_path), str(partial)],
            capture_output=True,
            text=True,
            timeout=_CONVERT_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0 or not partial.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise EmbeddingModelError(f"int8 conversion of {source.model_path} failed: {last}")
        # The digest is written last: a file without one is a conversion that did not finish.
        os.replace(partial, target)
        digest_file.write_text(file_sha256(target) + "\n")
    except subprocess.TimeoutExpired as exc:
        raise EmbeddingModelError(
            f"int8 conversion of {source.model_path} took over {exc.timeout} s"
        ) from exc
    finally:
        partial.unlink(missing_ok=True)
