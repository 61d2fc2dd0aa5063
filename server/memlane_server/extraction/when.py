"""Relative times resolved against the date a turn was said: "last May" said on 10 August 2023 is May
2023, "two weeks ago" is 27 July 2023.

A temporal question names the date ("What did Ana do in May 2023?"), the turn names it relative to
its own day; resolved at ingest, the date is stored with the item (``resolved_time``: ISO day, month or
year, whichever the phrase fixes) and its spellings join the item's search keys, so both retrievers
can match the question to the turn.
"""

from __future__ import annotations

import calendar
import datetime as dt
from dataclasses import dataclass

from .. import linear_regex

RESOLVED_KEY = "resolved_time"

_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "couple of": 2,
}  # fmt: skip
_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_WEEKDAYS = {name.lower(): i for i, name in enumerate(calendar.day_name)}
_COUNT = (
    r"(?P<n>\d{1,2}|a couple of|couple of|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
)
_PHRASE = linear_regex.compile(
    r"\b(?:"
    r"(?P<dby>the day before yesterday)"
    r"|(?P<yesterday>yesterday|last night)"
    r"|(?P<tomorrow>tomorrow)"
    rf"|{_COUNT}\s+(?P<unit>day|week|month|year)s?\s+ago"
    r"|(?P<rel>last|next)\s+(?P<what>week(?:end)?|month|year|"
    r"january|february|march|april|may|june|july|august|september|october|november|december|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
    r")\b",
    ignore_case=True,
)


@dataclass(frozen=True, slots=True)
class Resolved:
    phrase: str
    day: dt.date
    precision: str  # "day", "month" or "year"

    @property
    def iso(self) -> str:
        if self.precision == "year":
            return f"{self.day:%Y}"
        if self.precision == "month":
            return f"{self.day:%Y-%m}"
        return f"{self.day:%Y-%m-%d}"

    def spellings(self) -> list[str]:
        """How a question may name it: "27 July 2023", "July 2023", "2023"."""
        d = self.day
        if self.precision == "year":
            return [f"{d:%Y}"]
        if self.precision == "month":
            return [f"{d:%B %Y}", f"{d:%Y-%m}"]
        return [f"{d.day} {d:%B %Y}", f"{d:%B %Y}", f"{d:%Y-%m-%d}"]


def _add_months(day: dt.date, months: int) -> dt.date:
    total = day.year * 12 + day.month - 1 + months
    return dt.date(total // 12, total % 12 + 1, 1)


def _count(word: str) -> int:
    return int(word) if word.isdigit() else _NUMBERS.get(word.lower(), 0)


def _one(m: linear_regex.Match, said: dt.date) -> Resolved | None:
    phrase = m.group(0)
    if m.group("dby"):
        return Resolved(phrase, said - dt.timedelta(days=2), "day")
    if m.group("yesterday"):
        return Resolved(phrase, said - dt.timedelta(days=1), "day")
    if m.group("tomorrow"):
        return Resolved(phrase, said + dt.timedelta(days=1), "day")
    if m.group("unit"):
        n, unit = _count(m.group("n")), m.group("unit").lower()
        if n <= 0:
            return None
        if unit == "day":
            return Resolved(phrase, said - dt.timedelta(days=n), "day")
        if unit == "week":
            return Resolved(phrase, said - dt.timedelta(weeks=n), "day")
        if unit == "month":
            return Resolved(phrase, _add_months(said, -n), "month")
        return Resolved(phrase, dt.date(said.year - n, 1, 1), "year")
    step = -1 if m.group("rel").lower() == "last" else 1
    what = m.group("what").lower()
    if what == "week":
        return Resolved(phrase, said + dt.timedelta(weeks=step), "day")
    if what == "weekend":  # the Saturday before (or after) the day it was said
        offset = (said.weekday() - 5) % 7 or 7
        return Resolved(
            phrase, said - dt.timedelta(days=offset) if step < 0 else said + dt.timedelta(7 - offset), "day"
        )
    if what == "month":
        return Resolved(phrase, _add_months(said, step), "month")
    if what == "year":
        return Resolved(phrase, dt.date(said.year + step, 1, 1), "year")
    if what in _MONTHS:
        month = _MONTHS[what]
        year = said.year - (month >= said.month) if step < 0 else said.year + (month <= said.month)
        return Resolved(phrase, dt.date(year, month, 1), "month")
    weekday = _WEEKDAYS[what]
    offset = (said.weekday() - weekday) % 7 or 7
    return Resolved(
        phrase, said - dt.timedelta(days=offset) if step < 0 else said + dt.timedelta(7 - offset), "day"
    )


def resolve(text: str, said_at_ms: int) -> list[Resolved]:
    """The relative times ``text`` names, resolved against the day it was said (UTC); in order."""
    if said_at_ms <= 0:
        return []
    said = dt.datetime.fromtimestamp(said_at_ms / 1000, tz=dt.UTC).date()
    out = []
    for m in _PHRASE.finditer(text[:2000]):
        found = _one(m, said)
        if found is not None:
            out.append(found)
    return out


def time_metadata(found: list[Resolved]) -> dict[str, str]:
    return {RESOLVED_KEY: found[0].iso} if found else {}


def time_keys(found: list[Resolved]) -> list[str]:
    return list(dict.fromkeys(k for r in found for k in r.spellings()))
