"""The PII guard: personal data that must never become a long-term memory, whatever wrote it.

``find_pii`` names the kinds found (facts that hold one are rejected); ``redact`` replaces them with
``[KIND]`` placeholders (episodes keep the conversation but not the data). Patterns favour recall:
a false positive costs one memory, a false negative stores someone's card number.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass


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
    s = re.sub(r"\s+", "", candidate).upper()
    if not 15 <= len(s) <= 34:
        return False
    moved = s[4:] + s[:4]
    try:
        number = int("".join(str(int(ch, 36)) for ch in moved))
    except ValueError:
        return False
    return number % 97 == 1


def _card_ok(candidate: str) -> bool:
    digits = re.sub(r"[ -]", "", candidate)
    return 13 <= len(digits) <= 19 and luhn_ok(digits)


_DATE = re.compile(r"^(?:\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4})$")


def _phone_ok(candidate: str) -> bool:
    """International numbers may be short; otherwise ask for 9+ digits, and a bare digit run only
    when it starts like a trunk/mobile number, so order ids and dates are not mistaken for phones."""
    digits = re.sub(r"\D", "", candidate)
    if _DATE.match(candidate.strip()):
        return False
    if candidate.startswith("+"):
        return 7 <= len(digits) <= 15
    if not 9 <= len(digits) <= 15:
        return False
    has_separator = bool(re.search(r"[\s.()-]", candidate))
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
    kind: str
    pattern: re.Pattern[str]
    check: Callable[[str], bool] | None = None


# Order matters for redaction: specific shapes (keys, IBANs, cards) before the generic phone shape.
_RULES: tuple[_Rule, ...] = (
    _Rule("EMAIL", re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}\b")),
    _Rule(
        "SECRET",
        re.compile(
            r"\b(?:sk-(?:proj-|live-|test-)?[A-Za-z0-9_-]{16,}|sk_(?:live|test)_[A-Za-z0-9]{16,}"
            r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|xox[abpr]-[A-Za-z0-9-]{10,}"
            r"|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35}"
            r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"
        ),
    ),
    _Rule(
        "SECRET",
        re.compile(
            r"(?i)\b(?:password|passwd|pwd|passcode|api[ _-]?key|secret|token|access[ _-]?key)"
            r"\s*(?:is|=|:)\s*\S{4,}"
        ),
    ),
    _Rule("IBAN", re.compile(r"\b[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,4})?\b"), _iban_ok),
    _Rule("CARD", re.compile(r"\b\d(?:[ -]?\d){12,18}\b"), _card_ok),
    # US SSN, UK NINO, India Aadhaar (12 digits in 4-4-4) and PAN.
    _Rule("NATIONAL_ID", re.compile(r"\b(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}\b")),
    _Rule("NATIONAL_ID", re.compile(r"\b[A-CEGHJ-PR-TW-Z]{2}\s?\d{2}\s?\d{2}\s?\d{2}\s?[A-D]\b")),
    _Rule("NATIONAL_ID", re.compile(r"(?<![\d][ -])\b[2-9]\d{3}\s\d{4}\s\d{4}\b(?![ -]?\d)")),
    _Rule("NATIONAL_ID", re.compile(r"\b[A-Z]{5}\d{4}[A-Z]\b")),
    _Rule(
        "NATIONAL_ID",
        re.compile(
            r"(?i)\b(?:ssn|social security(?: number)?|passport(?: number| no\.?)?)"
            r"\s*(?:is|:|#)?\s*[A-Z0-9-]{6,}"
        ),
    ),
    # A date of birth identifies a person together with a name; a birthday without the year (a
    # reminder worth keeping) is not caught.
    _Rule(
        "DATE_OF_BIRTH",
        re.compile(
            rf"(?i)\b(?:(?:date\s+of\s+birth|birth\s*date|d\.?o\.?b\.?)\s*(?:is|was|:|-|=)?\s*"
            rf"|born\s+(?:on\s+(?:the\s+)?)?){_FULL_DATE}"
        ),
    ),
    # Before PHONE: "192.168.10.24" is also a run of digits with dots.
    _Rule("IP_ADDRESS", re.compile(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?!\w|\.\d)"), _ip_ok),
    _Rule(
        "IP_ADDRESS",
        re.compile(
            r"(?<![\w:])(?:[0-9A-Fa-f]{1,4}:){1,7}(?::|(?::[0-9A-Fa-f]{1,4}){1,7}|[0-9A-Fa-f]{1,4})(?![\w:])"
        ),
        _ip_ok,
    ),
    _Rule(
        "PHONE",
        re.compile(
            r"(?<![\w+-])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{1,4}\)[\s.-]?)?\d{2,4}(?:[\s.-]?\d{2,4}){2,4}(?!\w)"
        ),
        _phone_ok,
    ),
    _Rule(
        "ADDRESS",
        re.compile(
            # Street words capitalized ("221B Baker Street"), so "5 km on the main road" passes.
            rf"\b\d{{1,5}}[A-Za-z]?,?\s+(?:[A-Z][\w'.-]*\s+){{1,4}}(?i:{_STREET_TYPES})\b\.?",
        ),
    ),
    _Rule("ADDRESS", re.compile(r"(?i)\b(?:apt|apartment|flat|suite|unit)\s*#?\s*\d+[A-Z]?\b")),
    _Rule("ADDRESS", re.compile(r"(?i)\bp\.?\s?o\.?\s+box\s+\d+")),
)


def _matches(text: str) -> list[tuple[int, int, str]]:
    spans: list[tuple[int, int, str]] = []
    for rule in _RULES:
        for m in rule.pattern.finditer(text):
            if rule.check is not None and not rule.check(m.group(0)):
                continue
            if any(s < m.end() and m.start() < e for s, e, _ in spans):
                continue
            spans.append((m.start(), m.end(), rule.kind))
    return sorted(spans)


def find_pii(text: str) -> list[str]:
    """The kinds of personal data in ``text`` (``EMAIL``, ``PHONE``, ``CARD``, ...), deduplicated."""
    return list(dict.fromkeys(kind for _, _, kind in _matches(text)))


def redact(text: str) -> str:
    out: list[str] = []
    last = 0
    for start, end, kind in _matches(text):
        out.append(text[last:start])
        out.append(f"[{kind}]")
        last = end
    out.append(text[last:])
    return "".join(out)
