"""Patterns over caller text, compiled for RE2: matching time grows linearly with the text, whatever it holds.

Python's ``re`` backtracks: ``[\\w.+-]+@`` tried from every word start of ``"a." * 60000`` takes
seconds, and the interpreter lock is held the whole time, so a thread protects nothing and one chat
message stalls every request. RE2 (PyPI ``google-re2``) builds an automaton instead: no pattern can
take more than a constant per character. It has no lookaround and no backreferences; patterns that
used them are rewritten where they are defined (a capture group, or a check in code on the match).

RE2's ``\\w``, ``\\d`` and ``\\s`` are ASCII; Python's are Unicode ("José" is one word, a no-break space
is a space). ``compile`` rewrites them to the Unicode classes so a pattern keeps its meaning. ``\\b``
stays ASCII (RE2 has no Unicode word boundary): patterns that must see a boundary next to a
non-ASCII letter say so in their own code.

``compile_run`` is the one exception: a run of one character class (``\\w+``, ``\\s+``) cannot
backtrack in any engine, and Python's is twenty times faster per match than RE2's Python wrapper
(3 µs against 60 µs for the words of a question), which the request path and every turn's keywords
pay. It accepts nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

import re2

# Python's classes, spelt for RE2: str.isalnum() or "_" is a word character (letters and numbers,
# not combining marks); str.isspace() is a space (ASCII controls 9-13 and 28-31, NEL, Unicode Z*).
_WORD = r"\p{L}\p{N}_"
_DIGIT = r"\p{Nd}"
_SPACE = r"\t-\r\x{1c}-\x{20}\x{85}\p{Z}"
_IN_CLASS = {"w": _WORD, "d": _DIGIT, "s": _SPACE}
_NEGATED = {"W": _WORD, "D": _DIGIT, "S": _SPACE}
_COMPILED: list[Pattern] = []


class Match(Protocol):
    """The part of ``re.Match`` that RE2's match offers (offsets are in characters, like ``re``; groups by
    name only through ``group``)."""

    def group(self, group: int | str = 0, /) -> Any: ...
    def groups(self, default: Any = None) -> tuple[Any, ...]: ...
    def groupdict(self, default: Any = None) -> dict[str, Any]: ...
    def start(self, group: int = 0) -> int: ...
    def end(self, group: int = 0) -> int: ...
    def span(self, group: int = 0) -> tuple[int, int]: ...


class Pattern(Protocol):
    """The part of ``re.Pattern`` that RE2's pattern offers. On bytes (UTF-8) offsets are in bytes and a
    search from ``pos`` costs no re-encoding of the text."""

    @property
    def pattern(self) -> str: ...
    def search(
        self, text: str | bytes, pos: int | None = None, endpos: int | None = None
    ) -> Match | None: ...
    def match(self, text: str | bytes, pos: int | None = None, endpos: int | None = None) -> Match | None: ...
    def fullmatch(
        self, text: str | bytes, pos: int | None = None, endpos: int | None = None
    ) -> Match | None: ...
    def finditer(
        self, text: str | bytes, pos: int | None = None, endpos: int | None = None
    ) -> Iterator[Match]: ...
    def findall(self, text: str | bytes, pos: int | None = None, endpos: int | None = None) -> list[Any]: ...
    def split(self, text: str, maxsplit: int = 0) -> list[str]: ...
    def sub(self, repl: str | Callable[[Match], str], text: str, count: int = 0) -> str: ...


def unicode_classes(pattern: str) -> str:
    """``pattern`` with ``\\w \\d \\s`` (and their negations) spelt as Unicode classes RE2 reads."""
    out: list[str] = []
    in_class = False
    class_start = False  # just after "[" or "[^": a "]" there is a literal
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            i += 2
            class_start = False
            if nxt in _IN_CLASS:
                out.append(_IN_CLASS[nxt] if in_class else f"[{_IN_CLASS[nxt]}]")
            elif nxt in _NEGATED:
                if in_class:
                    raise ValueError(f"\\{nxt} inside a character class has no RE2 spelling: {pattern!r}")
                out.append(f"[^{_NEGATED[nxt]}]")
            elif nxt == "Z":
                out.append(r"\z")
            elif nxt == "u" and i + 4 <= len(pattern):
                out.append(r"\x{" + pattern[i : i + 4] + "}")
                i += 4
            else:
                out.append("\\" + nxt)
            continue
        if in_class:
            if ch == "]" and not class_start:
                in_class = False
            elif ch == "^" and class_start and out and out[-1] == "[":
                out.append(ch)
                i += 1
                continue
            class_start = False
        elif ch == "[":
            in_class = True
            class_start = True
        out.append(ch)
        i += 1
    return "".join(out)


def compile(pattern: str, *, ignore_case: bool = False) -> Pattern:
    """An RE2 pattern with Python's Unicode classes (leftmost-first: the same match as ``re`` for every
    pattern RE2 can spell). Raises ``re2.error`` for syntax RE2 lacks (lookaround, backreferences),
    so a pattern that could backtrack never compiles."""
    options = re2.Options()
    options.case_sensitive = not ignore_case
    spelt = unicode_classes(pattern)
    compiled = cast(Pattern, re2.compile(spelt, options))
    size = int(getattr(compiled, "programsize", 0))
    if size > _LARGE_PROGRAM:
        # Unicode classes under ignore-case make programs of tens of thousands of instructions, whose
        # automaton outgrows RE2's default 8 MB on a long text: RE2 then says "DFA out of memory" on
        # stderr and falls back to a slower engine. The cache grows only as a text needs it.
        options.max_mem = min(_MAX_MEM, size * _BYTES_PER_INSTRUCTION)
        compiled = cast(Pattern, re2.compile(spelt, options))
    _COMPILED.append(compiled)
    return compiled


_LARGE_PROGRAM = 8_000  # instructions; below this the default memory holds any text we match
_BYTES_PER_INSTRUCTION = 1024
_MAX_MEM = 64 * 1024 * 1024


# A single character class (an escape like \w, or [...] without nested brackets) repeated with "+".
_RUN = re.compile(r"(?:\\[wWdDsS]|\[\^?(?:\\.|[^\\\]\[])+\])\+")


def compile_run(pattern: str) -> Pattern:
    """A run of one character class, on Python's engine (see the module's doc): each character is
    read once whatever the text, so it is as linear as RE2 and cheaper per match."""
    if not _RUN.fullmatch(pattern):
        raise ValueError(f"not a run of one character class: {pattern!r}")
    compiled = cast(Pattern, re.compile(pattern))
    _COMPILED.append(compiled)
    return compiled


def compiled() -> tuple[Pattern, ...]:
    """Every pattern compiled so far (module constants, compiled at import): what the test of
    matching time on hostile text walks."""
    return tuple(_COMPILED)


def cut(pattern: Pattern, text: str) -> list[str]:
    """``re.split`` for a pattern whose lookbehind or lookahead became characters read around the
    separator: ``text`` cut at the first group that took part in each match (the whole match when
    none did), so the characters read around it stay in the pieces."""
    pieces: list[str] = []
    last = 0
    for m in pattern.finditer(text):
        start, end = m.span()
        for group in range(1, len(m.groups()) + 1):
            if m.start(group) >= 0:
                start, end = m.span(group)
                break
        pieces.append(text[last:start])
        last = end
    pieces.append(text[last:])
    return pieces
