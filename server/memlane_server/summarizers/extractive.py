"""An offline, deterministic, extractive summarizer (the default provider; no LLM), with the salience
weights that decide which identifiers a summary keeps (their section below).

The summary is a list of sentences copied verbatim from the turns, filed under a few headings::

    Decisions:
    - [#2 user] Let's go with the annual plan.
    Constraints:
    - [#3 user] The budget must stay under $400.
    Identifiers:
    - [#5 user] My order number is ORD-88231.
    Open items:
    - [#9 user] Can you email the invoice to ana@example.com?
    Context:
    - [#7 assistant] The annual plan includes priority support.

Merging parses the previous summary back into items (an unfamiliar summary, e.g. one an LLM or the
client wrote, is split into sentences and classified like new ones), so a new summary is made from the
previous one plus the leaving turns only. Sentences that differ only in their numbers are near-identical
and deduplicated (``rank``). Over budget, items leave by ascending value (``_victims``): a repeated
wording's older instances, then "Context", names, open items, identifiers, constraints, decisions; within
a kind the weakest identifier evidence (``salience``) first, and from the middle of the conversation
outwards, so the oldest items survive as well as the newest. A hard truncation is the last resort.

How much a sentence looks like something durable: an identifier, an amount, a date.

A long conversation is full of incidental numbers ("page 212", "give me 300 words", "step 4"); the
things a summary must keep verbatim are rarer and look different: codes mixing letters and digits
(``PO-77341-ZX``, ``INV2024-7``), labelled ids ("order number 4417"), e-mail addresses and URLs, money and
amounts with units, dates. ``weight`` scores that evidence; ``shape`` is a sentence with every token that
holds a digit blanked out, so routine lines that differ only in their numbers look alike.
"""

from __future__ import annotations

import asyncio
import enum
from concurrent.futures import Executor
from dataclasses import dataclass

from .. import linear_regex
from ..sessions.model import Message, Role
from ..tokens import TokenCounter
from .summarizer import SummaryResult

PROVIDER = "extractive"


class Kind(enum.IntEnum):
    """Item kinds; the value is the keep priority (higher survives the budget longer)."""

    CONTEXT = 0
    NAME = 1  # a sentence whose only identifier is a capitalized name: weaker evidence than an id
    OPEN = 2
    IDENTIFIER = 3
    CONSTRAINT = 4
    DECISION = 5


_HEADINGS: dict[Kind, str] = {
    Kind.DECISION: "Decisions",
    Kind.CONSTRAINT: "Constraints",
    Kind.IDENTIFIER: "Identifiers",
    Kind.NAME: "Names",
    Kind.OPEN: "Open items",
    Kind.CONTEXT: "Context",
}
_HEADING_TO_KIND = {v.lower(): k for k, v in _HEADINGS.items()}
# Render order: what the model most needs to honour first.
_RENDER_ORDER = (Kind.DECISION, Kind.CONSTRAINT, Kind.IDENTIFIER, Kind.NAME, Kind.OPEN, Kind.CONTEXT)

_DECISION = linear_regex.compile(
    r"\b(decided|decide|decision|agreed|agree to|let'?s go with|we'?ll go with|going with|go ahead|"
    r"chose|choose|chosen|selected|settled on|confirm(?:ed|s)?|approved?|finali[sz]ed?|"
    r"we will use|we'?ll use|opt(?:ed)? for|sign(?:ed)? off|the plan is)\b",
    ignore_case=True,
)
_CONSTRAINT = linear_regex.compile(
    r"\b(must|mustn'?t|never|always|required?|requirements?|only|at most|at least|no more than|"
    r"no later than|deadline|budget|cannot|can'?t|don'?t|do not|should not|shouldn'?t|limit(?:ed)?|"
    r"allerg(?:y|ic)|avoid|prefer(?:s|red)?|maximum|minimum|not allowed|forbidden)\b",
    ignore_case=True,
)
_TODO = linear_regex.compile(
    r"\b(todo|to-do|to do:|action item|follow[ -]up|remind me|remember to|need to|needs to|"
    r"i'?ll (?:send|check|get back|follow|call|email|look)|will send|pending|next step|still open)\b",
    ignore_case=True,
)
# A capitalized word not at the start of its sentence is probably a name (person, product, place).
# The name is group 1 (findall returns it); the two characters before it are read, not kept.
_NAME = linear_regex.compile(r"[a-z,;:] ([A-Z][a-z]+(?: [A-Z][a-z]+)*)")
# Cut at the spaces after . ! ? when a sentence starts after them, and at line breaks; the characters
# around the spaces stay in the pieces (linear_regex.cut).
_SENTENCE_SPLIT = linear_regex.compile(r"[.!?](\s+)[\"'(\[]?[A-Z0-9#]|(\n+)")
_ITEM_LINE = linear_regex.compile(r"^- (?:\[(?P<tag>[^\]]*)\] )?(?P<text>.+)$")
_SPACES = linear_regex.compile_run(r"\s+")


def _one_space(_: linear_regex.Match) -> str:  # a function: RE2's sub would parse a str as a template
    return " "


# Non-identifier words that often start with a capital mid-sentence.
_NOT_NAMES = frozenset({"I", "I'm", "I'll", "I've", "I'd", "OK", "Ok"})


# A summary keeps a few sentences per turn; the patterns read no further into one turn than this
# (a 256 KB paste of one-word sentences would otherwise be 80,000 sentences to classify).
MAX_TURN_CHARS = 16 * 1024
_TAG_SEQ = linear_regex.compile(r"^#(\d+)\b")
# A wording seen this often (numbers aside) is routine: only its newest instance keeps its rank.
_TEMPLATE_MIN = 3
_ROUTINE = -1  # the rank of demoted items: below every kind, dropped first


@dataclass(slots=True)
class _Item:
    kind: Kind
    tag: str  # "#seq role" provenance, or "" for items of an unfamiliar previous summary
    text: str
    order: int  # position in this merge: previous summary first, then the leaving turns
    rank: int = 0  # the kind's value, or _ROUTINE for a repeated wording's older instances
    weight: int = 0  # identifier evidence (``weight``, below)

    def line(self) -> str:
        return f"- [{self.tag}] {self.text}" if self.tag else f"- {self.text}"

    @property
    def when(self) -> tuple[int, int]:
        """Time order: by the turn's seq when the tag names one (a parsed summary is grouped by
        heading, not by time), then by position."""
        m = _TAG_SEQ.match(self.tag)
        return (int(m.group(1)) if m else 0, self.order)


def classify(sentence: str, *, answered: bool) -> Kind:
    """The kind of one sentence. ``answered``: a reply followed it, so a question in it is not open."""
    if _DECISION.search(sentence):
        return Kind.DECISION
    if _TODO.search(sentence) or (sentence.rstrip().endswith("?") and not answered):
        return Kind.OPEN
    if _CONSTRAINT.search(sentence):
        return Kind.CONSTRAINT
    if weight(sentence) >= STRONG_WEIGHT:
        return Kind.IDENTIFIER
    names = [n for n in _NAME.findall(sentence) if n not in _NOT_NAMES]
    if names:
        return Kind.NAME
    return Kind.CONTEXT


def split_sentences(text: str) -> list[str]:
    parts = (_SPACES.sub(_one_space, p).strip() for p in linear_regex.cut(_SENTENCE_SPLIT, text))
    return [p for p in parts if p]


def _norm(text: str) -> str:
    return _SPACES.sub(_one_space, text).strip().lower()


def _parse_previous(previous: str) -> list[_Item]:
    """Items of a previous summary: ours by heading, anything else sentence by sentence."""
    items: list[_Item] = []
    kind: Kind | None = None
    loose: list[str] = []
    for raw in previous.splitlines():
        line = raw.strip()
        if not line:
            continue
        head = line.rstrip(":").lower()
        if line.endswith(":") and head in _HEADING_TO_KIND:
            kind = _HEADING_TO_KIND[head]
            continue
        m = _ITEM_LINE.match(line)
        if kind is not None and m:
            items.append(_Item(kind, m.group("tag") or "", m.group("text"), len(items)))
        else:
            loose.append(line)
    for sentence in split_sentences(" ".join(loose)):
        # A foreign summary's questions were open when it was written; keep them as such.
        items.append(_Item(classify(sentence, answered=False), "", sentence, len(items)))
    return items


def _role_tag(msg: Message) -> str:
    who = msg.participant_name or Role(msg.role).name.lower()
    return f"#{msg.seq} {who}" if msg.seq else who


def _items_from_turns(leaving: list[Message], start_order: int) -> list[_Item]:
    items: list[_Item] = []
    order = start_order
    for i, msg in enumerate(leaving):
        if not msg.content.strip() or msg.role in (Role.SYSTEM, Role.DEVELOPER):
            continue
        # A user question is answered once a later non-user turn exists in this batch.
        answered = any(m.role != Role.USER for m in leaving[i + 1 :]) if msg.role == Role.USER else True
        context_taken = False
        for sentence in split_sentences(msg.content[:MAX_TURN_CHARS]):
            kind = classify(sentence, answered=answered)
            if kind == Kind.CONTEXT:
                # One context sentence per turn (its opening) keeps the thread without bloating.
                if context_taken:
                    continue
                context_taken = True
            items.append(_Item(kind, _role_tag(msg), sentence, order))
            order += 1
    return items


def rank(items: list[_Item]) -> list[_Item]:
    """Deduplicates and ranks merged items (oldest first in, time order out).

    Identical sentences are kept once. Sentences that differ only in their numbers ("page 12", "page
    13") are near-identical: without a durable identifier only the newest is kept; with one (distinct
    codes may all matter) they are all kept, but a wording repeated ``_TEMPLATE_MIN`` times or more is
    routine, so its older instances rank below everything else."""
    by_text: dict[str, _Item] = {}
    for it in items:
        by_text.setdefault(_norm(it.text), it)
    unique = sorted(by_text.values(), key=lambda it: it.when)
    shapes: dict[str, list[_Item]] = {}
    for it in unique:
        it.weight = weight(it.text)
        it.rank = int(it.kind)
        shapes.setdefault(shape(it.text), []).append(it)
    out: list[_Item] = []
    for it in unique:
        group = shapes[shape(it.text)]
        newest = group[-1] is it
        if not newest and it.weight < STRONG_WEIGHT:
            continue
        if not newest and len(group) >= _TEMPLATE_MIN:
            it.rank = _ROUTINE
        out.append(it)
    return out


def _victims(items: list[_Item]) -> list[_Item]:
    """The order in which items leave an over-budget summary: lowest rank first; within a rank, the
    weakest identifier evidence first; then from the middle of the conversation outwards, so that the
    oldest items (stated once, early: an order number, a name) stay alongside the newest."""
    by_rank: dict[int, list[_Item]] = {}
    for it in sorted(items, key=lambda it: it.when):
        by_rank.setdefault(it.rank, []).append(it)
    edge: dict[int, int] = {}
    for group in by_rank.values():
        for i, it in enumerate(group):
            edge[id(it)] = min(i, len(group) - 1 - i)
    return sorted(items, key=lambda it: (it.rank, it.weight, -edge[id(it)], it.when))


def render(items: list[_Item]) -> str:
    out: list[str] = []
    for kind in _RENDER_ORDER:
        lines = [it.line() for it in sorted(items, key=lambda it: it.when) if it.kind == kind]
        if lines:
            out.append(f"{_HEADINGS[kind]}:")
            out.extend(lines)
    return "\n".join(out)


class ExtractiveSummarizer:
    """Deterministic extractive summaries. CPU work runs on ``executor`` (None: the loop's default)."""

    def __init__(self, counter: TokenCounter, model: str = "", executor: Executor | None = None) -> None:
        self._counter = counter
        self._model = model
        self._executor = executor

    @property
    def provider(self) -> str:
        return PROVIDER

    async def summarize(self, previous: str, leaving: list[Message], budget_tokens: int) -> SummaryResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, self.summarize_sync, previous, leaving, budget_tokens
        )

    def summarize_sync(self, previous: str, leaving: list[Message], budget_tokens: int) -> SummaryResult:
        """The whole computation, synchronous (callers on an event loop use ``summarize``)."""
        budget = max(0, budget_tokens)
        tokens_in = self._counter.count(previous, self._model) + sum(
            (m.token_count or self._counter.count(m.content, self._model)) for m in leaving
        )
        prev_items = _parse_previous(previous)
        new_items = _items_from_turns(leaving, start_order=len(prev_items))
        text = self._fit(rank(prev_items + new_items), budget)
        out = self._counter.count(text, self._model)
        return SummaryResult(
            text=text, token_count=out, tokens_in=tokens_in, tokens_out=out, provider=PROVIDER
        )

    def _fit(self, items: list[_Item], budget: int) -> str:
        """Drops the least valuable items until the rendered summary fits ``budget`` (see ``_victims``)."""
        if budget <= 0 or not items:
            return ""
        counts = self._counter.count_many([it.line() for it in items], self._model)
        cost = {id(it): c + 1 for it, c in zip(items, counts, strict=True)}  # +1: the newline
        heading_cost = 4  # "Identifiers:\n" and the like; a generous fixed estimate per heading
        total = sum(cost.values()) + heading_cost * len({it.kind for it in items})
        kept = {id(it) for it in items}
        for victim in _victims(items):
            if total <= budget:
                break
            kept.discard(id(victim))
            total -= cost[id(victim)]
            if not any(it.kind == victim.kind and id(it) in kept for it in items):
                total -= heading_cost
        text = render([it for it in items if id(it) in kept])
        # Token counts are not exactly additive across lines; trim whole lines, then hard-truncate.
        while text and self._counter.count(text, self._model) > budget:
            lines = text.splitlines()
            if len(lines) <= 2:
                return self._counter.truncate(text, budget, self._model)
            text = "\n".join(_drop_one_line(lines))
        return text


def _drop_one_line(lines: list[str]) -> list[str]:
    """Drop the first item line of the lowest-value section present, and a heading left empty."""
    for kind in sorted(_HEADINGS):
        heading = f"{_HEADINGS[kind]}:"
        if heading in lines:
            i = lines.index(heading)
            if i + 1 < len(lines) and lines[i + 1].startswith("- "):
                del lines[i + 1]
                if i + 1 >= len(lines) or not lines[i + 1].startswith("- "):
                    del lines[i]
                return lines
    return lines[:-1]


# --- How much a sentence looks like something durable: an identifier, an amount, a date.

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
