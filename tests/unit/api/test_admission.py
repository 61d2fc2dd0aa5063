"""Admission limits spec parsing (api/admission.py)."""

from __future__ import annotations

import pytest

from memlane_server.api.admission import parse_limits
from memlane_server.config import Settings


def test_limits_parse_per_method_with_a_default() -> None:
    assert parse_limits("AssembleContext=4, SearchMemories=8,*=64") == {
        "AssembleContext": 4,
        "SearchMemories": 8,
        "*": 64,
    }
    assert parse_limits("") == {}
    assert parse_limits(Settings().server.admission_limits)["AssembleContext"] > 0  # the default parses


@pytest.mark.parametrize("spec", ["AssembleContext", "AssembleContext=-1", "=3", "A=x"])
def test_bad_limits_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="METHOD=N"):
        parse_limits(spec)
