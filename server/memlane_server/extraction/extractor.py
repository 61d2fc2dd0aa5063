"""The extractor's contract: what every provider returns, the screen its candidates pass (PII, small talk,
questions, restatements) and the metered wrapper around it.

What extraction produces, and the ``Extractor`` protocol providers implement.

What is never worth remembering: greetings, acknowledgements, questions, restatements, PII.

Applied to every provider's output (an LLM told not to store "thanks!" sometimes does anyway).

Extraction metrics, by provider (token usage is its own metric: the LLM bill), and a wrapper.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

from .. import linear_regex
from ..memory_kinds import MemoryDraft
from ..observability.metrics import ModelUsageMetrics
from ..sessions.model import Message, Session
from .pii import find_pii

# A stated memory is the shared draft (``memory_kinds``): ltm's ``NewMemory`` builds on the same class,
# so ingestion takes extraction's output as is and a field is declared once.
ExtractedMemory = MemoryDraft


@dataclass(slots=True)
class ExtractionResult:
    memories: list[ExtractedMemory] = field(default_factory=list)
    tokens_in: int = 0  # provider-billed tokens (0 for the offline rules)
    tokens_out: int = 0
    rejected_pii: int = 0  # candidates dropped by the PII guard
    rejected_picky: int = 0  # candidates dropped as greetings, acks, questions, restatements


class Extractor(Protocol):
    """Turns a session's messages into durable memories (never episodes: see ``episodes.py``)."""

    @property
    def provider(self) -> str: ...

    async def extract(self, messages: list[Message], session: Session) -> ExtractionResult: ...


# --- What is never worth remembering: greetings, acknowledgements, questions, restatements, PII.

_CHITCHAT = linear_regex.compile(
    r"^(?:hi|hello|hey|yo|good (?:morning|afternoon|evening|night)|bye|goodbye|see you|cheers|"
    r"thanks?(?: you)?(?: so much| a lot)?|thx|ty|ok(?:ay)?|k|sure|yes|yeah|yep|no|nope|cool|great|nice|"
    r"got it|sounds good|perfect|awesome|alright|all right|noted|understood|makes sense|lol|haha|"
    r"you'?re welcome|no problem|np)(?:[\s,!.]+(?:there|man|mate|again|then|thanks?|bot|assistant))*[\s!.]*$",
    ignore_case=True,
)
# Pleasantries: social talk that carries no fact ("how are you?", "nice to meet you", "I'm fine").
_PLEASANTRY = linear_regex.compile(
    r"^(?:how(?:'s| is| are) (?:you|it going|things|your day)(?: doing)?(?: today| this (?:morning|evening))?"
    r"|how have you been|what'?s up|sup|nice (?:to )?(?:meet|see|talk to) you(?: too)?|pleased to meet you"
    r"|(?:i'?m|i am) (?:good|fine|great|well|ok(?:ay)?|doing (?:good|fine|great|well))(?: too)?"
    r"(?:,? thanks?(?: you)?)?(?:,? (?:and|how about) you)?"
    r"|(?:and )?you|have a (?:nice|good|great|lovely) (?:day|evening|night|weekend|one)"
    r"|(?:talk|speak|chat) (?:to you )?(?:later|soon)|take care|welcome(?: back)?|glad to help"
    r"|happy to help|my pleasure|anytime)(?:[\s,!.]+(?:there|man|mate|again|then|thanks?|bot|assistant))*"
    r"[\s!.?]*$",
    ignore_case=True,
)
# Cut at the spaces after ! . ? (kept with their sentence), and at ", " or "; " before a word (the
# characters around the separator are read, not cut: linear_regex.cut).
_PARTS = linear_regex.compile(r"[!.?](\s+)|([,;]\s+)\w")
# "\b" after the word, spelt for Unicode: "isé" is not "is".
_QUESTION_START = linear_regex.compile(
    r"^(?:who|what|when|where|why|how|which|whose|whom|is|are|am|was|were|do|does|did|can|could|"
    r"would|will|shall|should|may|might|have|has|had)(?:$|[^\w])",
    ignore_case=True,
)
_RESTATEMENT = linear_regex.compile(
    r"^(?:as i (?:said|mentioned|told you)|like i said|again,|to repeat|i already (?:told|said))",
    ignore_case=True,
)
_MIN_CHARS = 8


def is_chitchat(text: str) -> bool:
    """Greetings, thanks, acknowledgements and pleasantries only ("Hi there! How are you?"): every
    sentence (or comma-separated part) of the text is one."""
    parts = [p.strip() for p in linear_regex.cut(_PARTS, text.strip()) if p.strip(" ,!.?")]
    return bool(parts) and all(_CHITCHAT.match(p) or _PLEASANTRY.match(p) for p in parts)


_ANSWER = linear_regex.compile(r"^(?:yes|yeah|yep|no|nope|sure|ok(?:ay)?|k)(?:$|[^\w])", ignore_case=True)
_NON_WORD = linear_regex.compile_run(r"[^\w]+")


def is_small_talk(text: str) -> bool:
    """Chitchat that answers nothing: a bare "Yes." or "No." may answer the turn before it (and is kept
    as an episode), "Hi there!" never does."""
    return is_chitchat(text) and not any(
        _ANSWER.match(p.strip()) for p in linear_regex.cut(_PARTS, text.strip())
    )


def is_question(text: str) -> bool:
    t = text.strip()
    return t.endswith("?") or bool(_QUESTION_START.match(t))


def normalized(text: str) -> str:
    return _NON_WORD.sub(lambda _: " ", text.lower()).strip()


def keep(memory: ExtractedMemory) -> bool:
    text = memory.content.strip()
    return not (
        len(text) < _MIN_CHARS or is_chitchat(text) or is_question(text) or bool(_RESTATEMENT.match(text))
    )


def screen(result: ExtractionResult) -> ExtractionResult:
    """Drop picky rejects, PII-bearing items and restatements (same normalized content twice)."""
    kept: list[ExtractedMemory] = []
    seen: set[str] = set()
    for memory in result.memories:
        if not keep(memory):
            result.rejected_picky += 1
            continue
        if find_pii(memory.content) or any(find_pii(k) for k in memory.keywords):
            result.rejected_pii += 1
            continue
        key = normalized(memory.content)
        if key in seen:
            result.rejected_picky += 1
            continue
        seen.add(key)
        kept.append(memory)
    result.memories = kept
    return result


# --- Extraction metrics, by provider (token usage is its own metric: the LLM bill), and a wrapper.


class ExtractionMetrics(ModelUsageMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry, "extraction")
        self.memories = Counter(
            "memlane_extraction_memories",
            "Candidate memories by fate (kept, rejected_pii, rejected_picky).",
            ["provider", "fate"],
            registry=registry,
        )


class MeteredExtractor:
    """An ``Extractor`` that records calls, tokens, fates and latency of the one it wraps."""

    def __init__(self, inner: Extractor, metrics: ExtractionMetrics) -> None:
        self._inner = inner
        self._metrics = metrics

    @property
    def provider(self) -> str:
        return self._inner.provider

    async def extract(self, messages: list[Message], session: Session) -> ExtractionResult:
        provider = self._inner.provider
        m = self._metrics
        result = await m.timed(provider, self._inner.extract(messages, session))
        m.tokens(provider, result.tokens_in, result.tokens_out)
        m.memories.labels(provider, "kept").inc(len(result.memories))
        m.memories.labels(provider, "rejected_pii").inc(result.rejected_pii)
        m.memories.labels(provider, "rejected_picky").inc(result.rejected_picky)
        return result
