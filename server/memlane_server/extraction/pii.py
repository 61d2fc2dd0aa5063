"""The PII guard: personal data that must never become a long-term memory, whatever wrote it.

``find_pii`` names the kinds found (facts that hold one are rejected); ``redact`` replaces them with
``[KIND]`` placeholders (episodes keep the conversation but not the data). Patterns favour recall:
a false positive costs one memory, a false negative stores someone's card number.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

from .. import linear_regex


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _iban_ok(candidate: str) -> bool:
    """ISO 13616 mod-97 check, so ordinary capitalized codes are not mistaken for IBANs."""
    s = "".join(candidate.split()).upper()
    if not 15 <= len(s) <= 34:
        return False
    moved = s[4:] + s[:4]
    try:
        number = int("".join(str(int(ch, 36)) for ch in moved))
    except ValueError:
        return False
    return number % 97 == 1


def _card_ok(candidate: str) -> bool:
    digits = candidate.replace(" ", "").replace("-", "")
    return 13 <= len(digits) <= 19 and luhn_ok(digits)


_DATE = linear_regex.compile(r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}")


def _phone_ok(candidate: str) -> bool:
    """International numbers may be short; otherwise ask for 9+ digits, and a bare digit run only
    when it starts like a trunk/mobile number, so order ids and dates are not mistaken for phones."""
    digits = "".join(ch for ch in candidate if ch.isdecimal())
    if _DATE.fullmatch(candidate.strip()):
        return False
    if candidate.startswith("+"):
        return 7 <= len(digits) <= 15
    if not 9 <= len(digits) <= 15:
        return False
    has_separator = any(ch.isspace() or ch in ".()-" for ch in candidate)
    return has_separator or (digits[0] == "0" and len(digits) >= 10)


def _ip_ok(candidate: str) -> bool:
    try:
        ipaddress.ip_address(candidate)
    except ValueError:
        return False
    return True


_MONTHS = (
    r"jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|"
    r"oct(?:ober)?|nov(?:ember)?|dec(?:ember)?"
)
# A full date (with its year): numeric, "12 March 1990", "March 12th, 1990".
_FULL_DATE = (
    rf"(?:\d{{4}}[-/.]\d{{1,2}}[-/.]\d{{1,2}}|\d{{1,2}}[-/.]\d{{1,2}}[-/.]\d{{2,4}}"
    rf"|\d{{1,2}}(?:st|nd|rd|th)?(?:\s+of)?\s+(?:{_MONTHS})\.?,?\s+\d{{4}}"
    rf"|(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}})"
)

_STREET_TYPES = (
    r"street|st|avenue|ave|road|rd|boulevard|blvd|lane|ln|drive|dr|court|ct|place|pl|way|terrace|"
    r"parkway|pkwy|highway|hwy|square|sq|strasse|straße|marg|nagar"
)


@dataclass(frozen=True, slots=True)
class _Rule:
    """``group`` is the captured datum. Where Python's pattern had a lookbehind or lookahead, the RE2
    pattern reads the character(s) before or after the datum instead (same matches, same priority
    order); ``back`` is how many of those characters before it a lookbehind needs, so the next search
    starts early enough to read them again."""

    kind: str
    pattern: linear_regex.Pattern
    check: Callable[[str], bool] | None = None
    group: int = 0
    back: int = 0
    tail: int = 0  # an optional group after ``group`` that, when it matched, ends the datum


def _ssn_ok(candidate: str) -> bool:
    """Area 000, 666 and 900-999, group 00 and serial 0000 are never issued."""
    area, group, serial = candidate.split("-")
    return area not in ("000", "666") and not area.startswith("9") and group != "00" and serial != "0000"


# Lookarounds, spelt for RE2 as characters read around the captured datum.
def _not_after(chars: str) -> str:
    """``(?<![chars])``: the start of the text, or one character not in ``chars``."""
    return rf"(?:^|[^{chars}])"


def _not_before(chars: str) -> str:
    """``(?![chars])``: the end of the text, or one character not in ``chars``."""
    return rf"(?:$|[^{chars}])"


def _bounded(body: str, *, end: bool = True) -> str:
    """``\bbody\b`` for a body that starts (and ends) with a word character, with Python's Unicode
    word boundary: RE2's ``\b`` is ASCII, so "é4111 1111 ..." would start a card number inside a word.
    The datum is group 1."""
    return _not_after(r"\w") + f"({body})" + (_not_before(r"\w") if end else "")


# Order matters for redaction: specific shapes (keys, IBANs, cards) before the generic phone shape.
_RULES: tuple[_Rule, ...] = (
    # Python's "\b" before the local part is Unicode ("élise@"); RE2's is ASCII. The local part starts
    # at the first word character of its run, as "\b" made it; the ASCII "\b" alternative lets the
    # next search start right after a previous address.
    _Rule(
        "EMAIL",
        linear_regex.compile(
            r"(?:^|[^\w.+-]|\b)[.+-]*(\w[\w.+-]*@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,})" + _not_before(r"\w")
        ),
        group=1,
    ),
    _Rule(
        "SECRET",
        linear_regex.compile(
            _bounded(
                r"sk-(?:proj-|live-|test-)?[A-Za-z0-9_-]{16,}|sk_(?:live|test)_[A-Za-z0-9]{16,}"
                r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|xox[abpr]-[A-Za-z0-9-]{10,}"
                r"|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35}"
                r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
                end=False,
            )
        ),
        group=1,
    ),
    _Rule(
        "SECRET",
        linear_regex.compile(
            _bounded(
                r"(?:password|passwd|pwd|passcode|api[ _-]?key|secret|token|access[ _-]?key)"
                r"\s*(?:is|=|:)\s*\S{4,}",
                end=False,
            ),
            ignore_case=True,
        ),
        group=1,
    ),
    _Rule(
        "IBAN",
        linear_regex.compile(_bounded(r"[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,4})?")),
        _iban_ok,
        group=1,
    ),
    _Rule("CARD", linear_regex.compile(_bounded(r"\d(?:[ -]?\d){12,18}")), _card_ok, group=1),
    # US SSN, UK NINO, India Aadhaar (12 digits in 4-4-4) and PAN.
    _Rule("NATIONAL_ID", linear_regex.compile(_bounded(r"\d{3}-\d{2}-\d{4}")), _ssn_ok, group=1),
    _Rule(
        "NATIONAL_ID",
        linear_regex.compile(_bounded(r"[A-CEGHJ-PR-TW-Z]{2}\s?\d{2}\s?\d{2}\s?\d{2}\s?[A-D]")),
        group=1,
    ),
    # Not inside a longer run of digit groups: no "<digit><space or dash>" before, no digit (after an
    # optional space or dash) after.
    _Rule(
        "NATIONAL_ID",
        linear_regex.compile(
            r"(?:^|^[^\w]|[^\d][^\w]|(?s:.)[^\w -])([2-9]\d{3}\s\d{4}\s\d{4})(?:$|[^\w -]|[ -]$|[ -][^\d])"
        ),
        group=1,
        back=1,
    ),
    _Rule("NATIONAL_ID", linear_regex.compile(_bounded(r"[A-Z]{5}\d{4}[A-Z]")), group=1),
    _Rule(
        "NATIONAL_ID",
        linear_regex.compile(
            _bounded(
                r"(?:ssn|social security(?: number)?|passport(?: number| no\.?)?)"
                r"\s*(?:is|:|#)?\s*[A-Z0-9-]{6,}",
                end=False,
            ),
            ignore_case=True,
        ),
        group=1,
    ),
    # A date of birth identifies a person together with a name; a birthday without the year (a
    # reminder worth keeping) is not caught.
    _Rule(
        "DATE_OF_BIRTH",
        linear_regex.compile(
            _bounded(
                rf"(?:(?:date\s+of\s+birth|birth\s*date|d\.?o\.?b\.?)\s*(?:is|was|:|-|=)?\s*"
                rf"|born\s+(?:on\s+(?:the\s+)?)?){_FULL_DATE}",
                end=False,
            ),
            ignore_case=True,
        ),
        group=1,
    ),
    # Before PHONE: "192.168.10.24" is also a run of digits with dots. Not followed by a word
    # character, nor by "." and a digit (a longer dotted number).
    _Rule(
        "IP_ADDRESS",
        linear_regex.compile(_not_after(r"\w.") + r"(\d{1,3}(?:\.\d{1,3}){3})(?:$|[^\w.]|\.$|\.[^\d])"),
        _ip_ok,
        group=1,
    ),
    _Rule(
        "IP_ADDRESS",
        linear_regex.compile(
            _not_after(r"\w:")
            + r"((?:[0-9A-Fa-f]{1,4}:){1,7}(?::|(?::[0-9A-Fa-f]{1,4}){1,7}|[0-9A-Fa-f]{1,4}))"
            + _not_before(r"\w:")
        ),
        _ip_ok,
        group=1,
    ),
    _Rule(
        "PHONE",
        linear_regex.compile(
            _not_after(r"\w+-")
            + r"((?:\+\d{1,3}[\s.-]?)?(?:\(\d{1,4}\)[\s.-]?)?\d{2,4}(?:[\s.-]?\d{2,4}){2,4})"
            + _not_before(r"\w")
        ),
        _phone_ok,
        group=1,
    ),
    _Rule(
        "ADDRESS",
        linear_regex.compile(
            # Street words capitalized ("221B Baker Street"), so "5 km on the main road" passes.
            # "\b\.?" after the street type: a dot after it belongs to it, whatever follows.
            _bounded(rf"\d{{1,5}}[A-Za-z]?,?\s+(?:[A-Z][\w'.-]*\s+){{1,4}}(?i:{_STREET_TYPES})", end=False)
            + r"(?:(\.)|$|[^\w.])",
        ),
        group=1,
        tail=2,
    ),
    _Rule(
        "ADDRESS",
        linear_regex.compile(
            _bounded(r"(?:apt|apartment|flat|suite|unit)\s*#?\s*\d+[A-Z]?"), ignore_case=True
        ),
        group=1,
    ),
    _Rule(
        "ADDRESS",
        linear_regex.compile(_bounded(r"p\.?\s?o\.?\s+box\s+\d+", end=False), ignore_case=True),
        group=1,
    ),
)


def _spans(data: bytes) -> list[tuple[int, int, str]]:
    """Non-overlapping byte spans of ``data`` (UTF-8), earlier rules first.

    Bytes, not str: the next search of a rule starts where its datum ended (a lookbehind's character
    may be the one the previous match read after it), and RE2 re-encodes a str on every search. Each
    rule's matches arrive in order, so one merge per rule keeps this linear in the matches (a text of
    30,000 addresses is one pass per rule, not 30,000 scans of the spans taken)."""
    spans: list[tuple[int, int, str]] = []
    for rule in _RULES:
        fresh: list[tuple[int, int, str]] = []
        i = 0
        pos = 0
        while (m := rule.pattern.search(data, pos)) is not None:
            start, end = m.span(rule.group)
            if rule.tail and m.end(rule.tail) >= 0:
                end = m.end(rule.tail)
            pos = max(end - rule.back, m.start() + 1)
            if rule.check is not None and not rule.check(data[start:end].decode("utf-8", "surrogatepass")):
                continue
            while i < len(spans) and spans[i][1] <= start:
                i += 1
            if i < len(spans) and spans[i][0] < end:
                continue  # overlaps a span an earlier rule took
            fresh.append((start, end, rule.kind))
        if fresh:
            spans = sorted([*spans, *fresh])
    return spans


def _utf8(text: str) -> bytes:
    # Protobuf strings are valid UTF-8; a lone surrogate from elsewhere survives the round trip.
    return text.encode("utf-8", "surrogatepass")


def find_pii(text: str) -> list[str]:
    """The kinds of personal data in ``text`` (``EMAIL``, ``PHONE``, ``CARD``, ...), deduplicated."""
    return list(dict.fromkeys(kind for _, _, kind in _spans(_utf8(text))))


def redact(text: str) -> str:
    data = _utf8(text)
    out: list[bytes] = []
    last = 0
    for start, end, kind in _spans(data):
        out.append(data[last:start])
        out.append(f"[{kind}]".encode())
        last = end
    out.append(data[last:])
    return b"".join(out).decode("utf-8", "surrogatepass")


# Longer than any datum the rules can recognise whole (an address of four words, an IBAN with
# spaces, a labelled passport number): what straddles a cut is still seen in full.
HEAD_MARGIN_CHARS = 200


def redact_head(text: str, limit: int) -> str:
    """``redact(text)[:limit]`` without reading all of a long text: the patterns see ``limit`` +
    ``HEAD_MARGIN_CHARS`` characters. A datum that starts before the cut is replaced whole; nothing
    after the cut is kept, so a datum the window cut in two is never shown in part."""
    if len(text) <= limit + HEAD_MARGIN_CHARS:
        return redact(text)[:limit]
    data = _utf8(text[: limit + HEAD_MARGIN_CHARS])
    cut = len(_utf8(text[:limit]))
    out: list[bytes] = []
    last = 0
    for start, end, kind in _spans(data):
        if start >= cut:
            break
        out.append(data[last:start])
        out.append(f"[{kind}]".encode())
        last = end
    if last < cut:
        out.append(data[last:cut])
    return b"".join(out).decode("utf-8", "surrogatepass")[:limit]
