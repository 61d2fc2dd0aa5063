"""Hostile text cannot stall the sidecar: every pattern that reads caller text runs in linear time.

Python's ``re`` backtracks and holds the interpreter lock for a whole search: the PII e-mail pattern
tried from every word start of ``"a." * 60000`` took minutes and froze every request. The patterns are
RE2 now (``memlane_server.linear_regex``); this times each one on 256 KB inputs of the shapes that
make backtracking engines blow up, and the functions that run them on a whole turn.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import memlane_server
from memlane_server import linear_regex
from memlane_server.api import memory_history  # noqa: F401 - compiles its patterns
from memlane_server.extraction import extractor, keywords, pii
from memlane_server.extraction.rules import RulesExtractor
from memlane_server.ltm import conflicts, recall, store, words  # noqa: F401
from memlane_server.paging import MAX_TOKEN_CHARS  # noqa: F401 - compiles its pattern
from memlane_server.sessions import events  # noqa: F401
from memlane_server.sessions.model import Message, Role
from memlane_server.summarizers import extractive

SIZE = 256 * 1024
# Generous, for a loaded machine: RE2 scans 256 KB in milliseconds and costs a few microseconds per
# match (130,000 matches: about a second); the backtracking patterns took minutes.
PATTERN_BOUND_S = 4.0
FUNCTION_BOUND_S = 8.0


def _shape(unit: str) -> str:
    return (unit * (SIZE // len(unit) + 1))[:SIZE]


SHAPES = {
    "a-dot": _shape("a."),
    "digits": _shape("1"),
    "digit-groups": _shape("1 "),
    "at-signs": _shape("@"),
    "spaces": _shape(" "),
    "unicode": _shape("é. ü語"),
    "emails": _shape("a@b.cc "),
}

# Modules that still use ``re``, and why no caller text reaches them.
RE_ALLOWED = {
    "linear_regex.py": "compile_run: a run of one character class, which no engine can backtrack on",
    "sessions/model.py": "durations in the operator's policy file",
    "ltm/sharing.py": "LanceDB's own error messages",
    "build_info.py": "the commit hash read from git or the image's build.json",
    "api/enums.py": "enum names from the proto descriptors, at import",
    "pipelines/archive.py": "object names the sidecar wrote (session ids are bounded and checked)",
}


def test_no_module_reads_caller_text_with_a_backtracking_engine() -> None:
    root = Path(memlane_server.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("eval/", "bench/")) or rel in RE_ALLOWED:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            if any(n == "re" or n.startswith("re.") or n == "regex" for n in names):
                offenders.append(rel)
    assert offenders == [], f"use memlane_server.linear_regex (RE2) for caller text: {offenders}"


def test_every_pattern_runs_in_linear_time_on_hostile_text() -> None:
    patterns = linear_regex.compiled()
    # PII, keywords, small talk, rules, salience, summaries, recall terms, speakers, ids: all of them.
    assert len(patterns) >= 60
    slowest = (0.0, "", "")
    for pattern in patterns:
        for name, text in SHAPES.items():
            start = time.perf_counter()
            for _ in pattern.finditer(text):
                pass
            pattern.match(text)
            elapsed = time.perf_counter() - start
            assert elapsed < PATTERN_BOUND_S, f"{pattern.pattern[:80]!r} on {name}: {elapsed:.2f} s"
            slowest = max(slowest, (elapsed, name, pattern.pattern[:60]))
    print(f"slowest pattern: {slowest[0] * 1000:.1f} ms on {slowest[1]} ({slowest[2]!r})")


def _user(text: str) -> Message:
    return Message(message_id="m1", session_id="s1", role=Role.USER, content=text, created_at_ms=1)


FUNCTIONS: dict[str, Callable[[str], object]] = {
    "redact": pii.redact,
    "find_pii": pii.find_pii,
    "redact_head": lambda t: pii.redact_head(t, 1200),
    "keywords": keywords.keywords,
    "is_small_talk": extractor.is_small_talk,
    "normalized": extractor.normalized,
    "rules": lambda t: RulesExtractor().extract_sync([_user(t)]),
    "weight": extractive.weight,
    "shape": extractive.shape,
    "split_sentences": extractive.split_sentences,
    "classify": lambda t: extractive.classify(t, answered=False),
    "content_terms": words.content_terms,
}


@pytest.mark.parametrize("function", sorted(FUNCTIONS))
def test_text_functions_take_bounded_time_on_a_whole_hostile_turn(function: str) -> None:
    for name, text in SHAPES.items():
        start = time.perf_counter()
        FUNCTIONS[function](text)
        elapsed = time.perf_counter() - start
        assert elapsed < FUNCTION_BOUND_S, f"{function} on {name}: {elapsed:.2f} s"


def test_redact_head_reads_only_the_head_and_keeps_a_datum_across_the_cut() -> None:
    card = "4111 1111 1111 1111"
    text = "x" * 1190 + " " + card + " " + "a." * 60000
    head = pii.redact_head(text, 1200)
    assert head.endswith("[CARD]") and "4111" not in head
    # Positive control: short text is redacted as a whole.
    assert (
        pii.redact_head(f"mail me at jo@example.com, card {card}", 1200) == "mail me at [EMAIL], card [CARD]"
    )


def test_lookbehinds_spelt_for_re2_keep_their_meaning() -> None:
    # PHONE had (?<![\w+-]) ... (?!\w): a shorter number is found when the longest is glued to a word.
    assert pii.redact("call +44 20 7946 0958x2") == "call [PHONE] 0958x2"
    assert pii.redact("ids x12 555 123 4567") == "ids x12 [PHONE]"
    # Python's word boundary is Unicode: a card number inside a word is not cut at an accent.
    assert pii.redact("ref é9-4111 1111 1111 1111") == "ref é9-[CARD]"
    assert pii.redact("élise@example.fr wrote") == "[EMAIL] wrote"
    assert pii.redact("fe80::1 and 10.0.0.1.") == "[IP_ADDRESS] and [IP_ADDRESS]."
    assert pii.redact("221B Baker Street.Then") == "[ADDRESS]Then"
    assert linear_regex.cut(linear_regex.compile(r"[.!?](\s+)|\n+"), "One. Two!\n\nThree") == [
        "One.",
        "Two!",
        "Three",
    ]


def test_unicode_classes_match_pythons() -> None:
    words = linear_regex.compile(r"\w+")
    assert words.findall("José café ٣٤ x_y") == ["José", "café", "٣٤", "x_y"]
    assert linear_regex.compile(r"\s+").split("a\xa0b\u2003c\td") == ["a", "b", "c", "d"]
    assert linear_regex.unicode_classes(r"[^\w.]\S") == r"[^\p{L}\p{N}_.][^\t-\r\x{1c}-\x{20}\x{85}\p{Z}]"
    with pytest.raises(ValueError):
        linear_regex.unicode_classes(r"[\W]")


_DFA_PROBE = """
import os
from memlane_server import linear_regex
from memlane_server.extraction.rules import RulesExtractor  # compiles the extractor's patterns
from memlane_server.extraction import extractor, keywords, pii  # noqa: F401
text = open(os.environ["PROBE_TEXT"]).read()
for p in list(linear_regex._COMPILED):
    for _ in p.finditer(text):
        pass
"""


def test_no_pattern_outgrows_its_automaton_memory(tmp_path: Path) -> None:
    """RE2 says "DFA out of memory" on stderr (and falls back to a slower engine) when a pattern's
    automaton outgrows its memory budget: the ignore-case Unicode patterns did on a long conversation.
    Run in a fresh interpreter, as RE2 writes to the process's own stderr."""
    turns = [
        "My favourite band is the one that played at the festival last summer, and honestly it is great!",
        "I went hiking with my sister near the lake; Caroline said she loves painting sunsets.",
        "¿Qué tal? Ça va — my fave café is Zürich's Grünfeld, and my favorite food is ramen.",
    ]
    path = tmp_path / "long.txt"
    path.write_text(" ".join(turns[i % 3] + f" turn {i}." for i in range(4000)))
    done = subprocess.run(
        [sys.executable, "-c", _DFA_PROBE],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PROBE_TEXT": str(path)},
        check=True,
    )
    assert "DFA out of memory" not in done.stderr, done.stderr[-500:]
