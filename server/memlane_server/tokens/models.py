"""What we know of model families: their tokenizer and their context window."""

from __future__ import annotations

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
