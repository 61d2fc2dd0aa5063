"""Offline tiktoken encodings.

``tiktoken.get_encoding`` downloads its BPE files; these machines (and air-gapped clusters) cannot.
The ranks files ship inside the ``bpe-openai`` wheel, so we build ``tiktoken.Encoding`` from them and
check their sha256 (the same hashes tiktoken pins upstream).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import threading
from pathlib import Path

import tiktoken

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
