"""How much a sentence looks like something durable: an identifier, an amount, a date.

A long conversation is full of incidental numbers ("page 212", "give me 300 words", "step 4"); the
things a summary must keep verbatim are rarer and look different: codes mixing letters and digits
(``PO-77341-ZX``, ``INV2024-7``), labelled ids ("order number 4417"), e-mail addresses and URLs, money and
amounts with units, dates. ``weight`` scores that evidence; ``shape`` is a sentence with every token that
holds a digit blanked out, so routine lines that differ only in their numbers look alike.
"""

from __future__ import annotations

import re

_MONTH = r"(?:jan|feb|mar|apr|(?-i:May)|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*"
# Strong evidence: each match counts 3.
_STRONG = (
    re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+"),  # e-mail
    re.compile(r"\bhttps?://\S+|\bwww\.\S+", re.IGNORECASE),  # URL
    # A code mixing letters and digits, at least 4 characters: PO-77341-ZX, INV2024-7, AB12345, 7XK9Q.
    # Not ordinals, times or decades ("21st", "10am", "1990s").
    re.compile(
        r"\b(?!\d+(?:st|nd|rd|th|am|pm|s)\b)(?=[A-Za-z0-9_-]*[A-Za-z])(?=[A-Za-z0-9_-]*\d)"
        r"[A-Za-z0-9][A-Za-z0-9_-]{2,}[A-Za-z0-9]\b"
    ),
    re.compile(
        r"\b(?:order|ticket|case|invoice|account|booking|reference|ref|id|po|sku|serial|tracking|"
        r"confirmation|policy|claim|member(?:ship)?)\s*(?:no\.?|number|num|#|:|id)?\s*#?\d{3,}",
        re.IGNORECASE,
    ),  # labelled number: "order 4417", "ticket #5521", "account number 123456"
    re.compile(r"[$€£¥]\s?\d[\d,.]*|\b\d[\d,.]*\s?(?:usd|eur|gbp|chf|jpy|dollars?|euros?|pounds?)\b", re.I),
    re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b"),  # dates
    re.compile(rf"\b{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?\b", re.I),  # "March 3rd"
    re.compile(rf"\b\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{_MONTH}\b", re.I),  # "3rd of March"
)
# Medium evidence (2): amounts with a unit, long digit runs (account, phone), "#123".
_MEDIUM = (
    re.compile(
        r"\b\d[\d,.]*\s?(?:%|percent\b|kg\b|mg\b|lbs?\b|oz\b|km\b|miles?\b|cm\b|mm\b|ft\b|ml\b|"
        r"gb\b|mb\b|tb\b|kb\b|kwh\b|kw\b|mph\b|units?\b|pcs\b|seats?\b|licen[cs]es?\b)",
        re.IGNORECASE,
    ),
    re.compile(r"\b\d{5,}\b"),
    re.compile(r"#\d{2,}\b"),
)
# Weak evidence (1): any other number of three digits or more, or a decimal.
_WEAK = re.compile(r"\b\d{3,}\b|\b\d+\.\d+\b")
# Identifier evidence at or above this is durable; below it a number is incidental.
STRONG_WEIGHT = 2
_MAX_WEIGHT = 9
_DIGIT_TOKEN = re.compile(r"\S*\d\S*")
_NON_WORD = re.compile(r"[^a-z#]+")


def weight(sentence: str) -> int:
    """0 (no identifier-like content) .. 9 (several strong identifiers)."""
    score = 3 * sum(len(p.findall(sentence)) for p in _STRONG)
    score += 2 * sum(len(p.findall(sentence)) for p in _MEDIUM)
    if score == 0:
        score = min(1, len(_WEAK.findall(sentence)))
    return min(score, _MAX_WEIGHT)


def shape(sentence: str) -> str:
    """The sentence with every token holding a digit replaced by ``#``, lower case, letters only."""
    return _NON_WORD.sub(" ", _DIGIT_TOKEN.sub("#", sentence.lower())).strip()
