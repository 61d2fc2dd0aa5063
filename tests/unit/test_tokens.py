"""Which tokenizer and context window a model name gets (tokens.py): the longest known prefix wins,
case and surrounding spaces aside; an unknown or empty name gets the default."""

from __future__ import annotations

import pytest

from memlane_server.tokens import DEFAULT_ENCODING, context_window_for_model, encoding_for_model


@pytest.mark.parametrize(
    ("model", "encoding", "window"),
    [
        ("gpt-4o-mini", "o200k_base", 128_000),
        ("gpt-4-turbo-2024-04-09", "cl100k_base", 128_000),  # not gpt-4's 8k: the longer prefix wins
        ("gpt-4-0613", "cl100k_base", 8_192),
        ("  GPT-4.1-nano ", "o200k_base", 1_047_576),
        ("claude-3-5-sonnet", "cl100k_base", 200_000),
    ],
)
def test_known_families(model: str, encoding: str, window: int) -> None:
    assert encoding_for_model(model) == encoding
    assert context_window_for_model(model) == window


def test_unknown_or_empty_names_get_the_default() -> None:
    assert encoding_for_model("some-local-model") == DEFAULT_ENCODING
    assert encoding_for_model("", default="o200k_base") == "o200k_base"
    assert context_window_for_model("some-local-model", default=4096) == 4096
