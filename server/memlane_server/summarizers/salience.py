"""How much a sentence looks like something durable: an identifier, an amount, a date.

A long conversation is full of incidental numbers ("page 212", "give me 300 words", "step 4"); the
things a summary must keep verbatim are rarer and look different: codes mixing letters and digits
(``PO-77341-ZX``, ``INV2024-7``), labelled ids ("order number 4417"), e-mail addresses and URLs, money and
amounts with units, dates. ``weight`` scores that evidence; ``shape`` is a sentence with every token that
holds a digit blanked out, so routine lines that differ only in their numbers look alike.
"""

from __future__ import annotations

from .. import linear_regex

_MONTH = r"(?:jan|feb|mar|apr|(?-i:May)|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*"
# Strong evidence: each match counts 3.
_STRONG = (
    linear_regex.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+"),  # e-mail
    linear_regex.compile(r"\bhttps?://\S+|\bwww\.\S+", ignore_case=True),  # URL
    linear_regex.compile(
        r"\b(?:order|ticket|case|invoice|account|booking|reference|ref|id|po|sku|serial|tracking|"
        r"confirmation|policy|claim|member(?:ship)?)\s*(?:no\.?|number|num|#|:|id)?\s*#?\d{3,}",
        ignore_case=True,
    ),  # labelled number: "order 4417", "ticket #5521", "account number 123456"
    linear_regex.compile(
        r"[$€£¥]\s?\d[\d,.]*|\b\d[\d,.]*\s?(?:usd|eur|gbp|chf|jpy|dollars?|euros?|pounds?)\b",
        ignore_case=True,
    ),
    linear_regex.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b"),  # dates
    linear_regex.compile(rf"\b{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?\b", ignore_case=True),  # "March 3rd"
    linear_regex.compile(
        rf"\b\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{_MONTH}\b", ignore_case=True
    ),  # "3rd of March"
)
# A code mixing letters and digits, at least 4 characters: PO-77341-ZX, INV2024-7, AB12345, 7XK9Q.
# Not ordinals, times or decades ("21st", "10am", "1990s"). Strong too; the lookaheads that said so
# in one backtracking pattern are checks on the match (_is_code).
_CODE = linear_regex.compile(r"\b[A-Za-z0-9][A-Za-z0-9_-]{2,}[A-Za-z0-9]\b")
_ORDINAL_OR_TIME = linear_regex.compile(r"\d+(?:st|nd|rd|th|am|pm|s)(?:$|[^\w])")
# Medium evidence (2): amounts with a unit, long digit runs (account, phone), "#123".
_MEDIUM = (
    linear_regex.compile(
        r"\b\d[\d,.]*\s?(?:%|percent\b|kg\b|mg\b|lbs?\b|oz\b|km\b|miles?\b|cm\b|mm\b|ft\b|ml\b|"
        r"gb\b|mb\b|tb\b|kb\b|kwh\b|kw\b|mph\b|units?\b|pcs\b|seats?\b|licen[cs]es?\b)",
        ignore_case=True,
    ),
    linear_regex.compile(r"\b\d{5,}\b"),
    linear_regex.compile(r"#\d{2,}\b"),
)
# Weak evidence (1): any other number of three digits or more, or a decimal.
_WEAK = linear_regex.compile(r"\b\d{3,}\b|\b\d+\.\d+\b")
# Identifier evidence at or above this is durable; below it a number is incidental.
STRONG_WEIGHT = 2
_MAX_WEIGHT = 9
_DIGIT_TOKEN = linear_regex.compile(r"\S*\d\S*")
_NON_WORD = linear_regex.compile_run(r"[^a-z#]+")


def _is_code(token: str) -> bool:
    return (
        any(c.isalpha() for c in token)
        and any(c.isdigit() for c in token)
        and not _ORDINAL_OR_TIME.match(token)
    )


def _codes(sentence: str) -> int:
    return sum(1 for m in _CODE.finditer(sentence) if _is_code(m.group(0)))


def weight(sentence: str) -> int:
    """0 (no identifier-like content) .. 9 (several strong identifiers)."""
    score = 3 * (sum(len(p.findall(sentence)) for p in _STRONG) + _codes(sentence))
    score += 2 * sum(len(p.findall(sentence)) for p in _MEDIUM)
    if score == 0:
        score = min(1, len(_WEAK.findall(sentence)))
    return min(score, _MAX_WEIGHT)


def shape(sentence: str) -> str:
    """The sentence with every token holding a digit replaced by ``#``, lower case, letters only."""
    # Functions, not strings: RE2's sub would read a string as a template.
    return _NON_WORD.sub(lambda _: " ", _DIGIT_TOKEN.sub(lambda _: "#", sentence.lower())).strip()
