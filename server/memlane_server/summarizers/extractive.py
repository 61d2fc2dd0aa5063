"""An offline, deterministic, extractive summarizer (the default provider; no LLM).

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
previous one plus the leaving turns only. Over budget, "Context" items go first (oldest first), then the
verbatim-kept kinds by ascending value (names, open items, identifiers, constraints, decisions), oldest
first; a hard truncation is the last resort.
"""

from __future__ import annotations

import asyncio
import enum
import re
from concurrent.futures import Executor
from dataclasses import dataclass

from memlane_server.sessions.model import Message, Role
from memlane_server.tokens import TokenCounter

from .base import SummaryResult

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

_DECISION = re.compile(
    r"\b(decided|decide|decision|agreed|agree to|let'?s go with|we'?ll go with|going with|go ahead|"
    r"chose|choose|chosen|selected|settled on|confirm(?:ed|s)?|approved?|finali[sz]ed?|"
    r"we will use|we'?ll use|opt(?:ed)? for|sign(?:ed)? off|the plan is)\b",
    re.IGNORECASE,
)
_CONSTRAINT = re.compile(
    r"\b(must|mustn'?t|never|always|required?|requirements?|only|at most|at least|no more than|"
    r"no later than|deadline|budget|cannot|can'?t|don'?t|do not|should not|shouldn'?t|limit(?:ed)?|"
    r"allerg(?:y|ic)|avoid|prefer(?:s|red)?|maximum|minimum|not allowed|forbidden)\b",
    re.IGNORECASE,
)
_TODO = re.compile(
    r"\b(todo|to-do|to do:|action item|follow[ -]up|remind me|remember to|need to|needs to|"
    r"i'?ll (?:send|check|get back|follow|call|email|look)|will send|pending|next step|still open)\b",
    re.IGNORECASE,
)
_IDENTIFIERS = (
    re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+"),  # email used as an identifier
    re.compile(r"\bhttps?://\S+|\bwww\.\S+", re.IGNORECASE),  # URL
    re.compile(r"\b[A-Z]{1,6}[-_#]?\d{2,}[A-Z0-9-]*\b"),  # ORD-88231, INV2024-7, AB12345
    re.compile(r"#\d{2,}\b"),  # #4521
    re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b"),  # dates
    re.compile(
        r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.? \d{1,2}(?:st|nd|rd|th)?\b",
        re.IGNORECASE,
    ),
    re.compile(r"[$€£]\s?\d[\d,.]*|\b\d[\d,.]*\s?(?:usd|eur|gbp|%)", re.IGNORECASE),  # money, percent
    re.compile(r"\b\d{3,}\b|\b\d+\.\d+\b"),  # long numbers, decimals (account, phone, version)
    re.compile(
        r"\b(?:order|ticket|case|invoice|account|booking|reference|ref|id)\s*(?:no\.?|number|#|:)",
        re.IGNORECASE,
    ),
)
# A capitalized word not at the start of its sentence is probably a name (person, product, place).
_NAME = re.compile(r"(?<=[a-z,;:] )[A-Z][a-z]+(?: [A-Z][a-z]+)*")
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9#])|\n+")
_ITEM_LINE = re.compile(r"^- (?:\[(?P<tag>[^\]]*)\] )?(?P<text>.+)$")
_SPACES = re.compile(r"\s+")
# Non-identifier words that often start with a capital mid-sentence.
_NOT_NAMES = frozenset({"I", "I'm", "I'll", "I've", "I'd", "OK", "Ok"})


@dataclass(slots=True)
class _Item:
    kind: Kind
    tag: str  # "#seq role" provenance, or "" for items of an unfamiliar previous summary
    text: str
    order: int  # position in time: older items have smaller numbers

    def line(self) -> str:
        return f"- [{self.tag}] {self.text}" if self.tag else f"- {self.text}"


def classify(sentence: str, *, answered: bool) -> Kind:
    """The kind of one sentence. ``answered``: a reply followed it, so a question in it is not open."""
    if _DECISION.search(sentence):
        return Kind.DECISION
    if _TODO.search(sentence) or (sentence.rstrip().endswith("?") and not answered):
        return Kind.OPEN
    if _CONSTRAINT.search(sentence):
        return Kind.CONSTRAINT
    if any(p.search(sentence) for p in _IDENTIFIERS):
        return Kind.IDENTIFIER
    names = [n for n in _NAME.findall(sentence) if n not in _NOT_NAMES]
    if names:
        return Kind.NAME
    return Kind.CONTEXT


def split_sentences(text: str) -> list[str]:
    parts = (_SPACES.sub(" ", p).strip() for p in _SENTENCE_SPLIT.split(text))
    return [p for p in parts if p]


def _norm(text: str) -> str:
    return _SPACES.sub(" ", text).strip().lower()


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
        for sentence in split_sentences(msg.content):
            kind = classify(sentence, answered=answered)
            if kind == Kind.CONTEXT:
                # One context sentence per turn (its opening) keeps the thread without bloating.
                if context_taken:
                    continue
                context_taken = True
            items.append(_Item(kind, _role_tag(msg), sentence, order))
            order += 1
    return items


def render(items: list[_Item]) -> str:
    out: list[str] = []
    for kind in _RENDER_ORDER:
        lines = [it.line() for it in sorted(items, key=lambda it: it.order) if it.kind == kind]
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
        items: list[_Item] = []
        seen: set[str] = set()
        for it in prev_items + new_items:
            key = _norm(it.text)
            if key in seen:
                continue
            seen.add(key)
            items.append(it)
        text = self._fit(items, budget)
        out = self._counter.count(text, self._model)
        return SummaryResult(
            text=text, token_count=out, tokens_in=tokens_in, tokens_out=out, provider=PROVIDER
        )

    def _fit(self, items: list[_Item], budget: int) -> str:
        if budget <= 0 or not items:
            return ""
        counts = self._counter.count_many([it.line() for it in items], self._model)
        cost = {id(it): c + 1 for it, c in zip(items, counts, strict=True)}  # +1: the newline
        heading_cost = 4  # "Identifiers:\n" and the like; a generous fixed estimate per heading
        total = sum(cost.values()) + heading_cost * len({it.kind for it in items})
        # Drop order: lowest kind first; within a kind, oldest first (the newest is likeliest to matter).
        victims = sorted(items, key=lambda it: (it.kind, it.order))
        kept = {id(it) for it in items}
        for victim in victims:
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
