"""``RulesExtractor``: the offline, deterministic default, with attribution (whose a statement is, in a
group conversation; its section below, also used by episodes).

Reads only the user's own messages (what the assistant said is not the user's fact), sentence by
sentence, and matches first-person patterns. Each match becomes a third-person memory ("User lives in
Pune.") so it reads the same in any later context. Captures stop at clause boundaries so one sentence
cannot drag a paragraph into memory.

Whose a fact is, and the sentence forms the first-person rules read.

Extractors write facts about "User"; in a conversation between named people (participants), "User"
would file two people's facts under one subject and the newer one would retire the other's. A fact
from a named speaker's turn names that speaker instead ("Ana lives in Lyon.") and carries the name as
its subject, which ingest compares before it merges or supersedes anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from .. import linear_regex
from ..memory_kinds import MemoryKind
from ..sessions.model import Message, Role, Session
from .extractor import ExtractedMemory, ExtractionResult, is_chitchat, is_question, screen
from .keywords import keywords
from .pii import find_pii
from .when import resolve, time_metadata

PROVIDER = "rules"

# Cut at the spaces after . ! ? ; (kept with their sentence: linear_regex.cut) and at line breaks.
_SENTENCE = linear_regex.compile(r"[.!?;](\s+)|\n+")
# A capture ends at the first clause boundary.
_CUT = linear_regex.compile(
    r"\s*(?:,|;|\.(?:\s|$)|!|\?| - | but | because | since | so | and then | which | who )", ignore_case=True
)
_MAX_CAPTURE = 80
# What a user says about themselves sits in what they type, not 200 KB into a pasted document; the
# patterns read no further into one message (each sentence costs every rule a search).
MAX_MESSAGE_CHARS = 8 * 1024
# "I'm from IT" or "I'm from the team" are not hometowns.
_NOT_PLACES = frozenset({"it", "hr", "the", "work", "here", "there"})


def _clip(value: str) -> str:
    cut = _CUT.search(value)
    value = (value[: cut.start()] if cut else value).strip(" .!\"'")
    return value[:_MAX_CAPTURE].strip()


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: linear_regex.Pattern
    kind: str
    render: Callable[[linear_regex.Match], str | None]
    slot: str | Callable[[linear_regex.Match], str] = ""
    importance: float = 0.6


_TEMPERATURE_UNITS = linear_regex.compile(r"celsius|fahrenheit")
_UNITS = linear_regex.compile(
    r"metric|imperial|kilo|pound|\bkm\b|miles?|\bkg\b|\blbs?\b|feet|meters?|metres?"
)


def _units_slot(text: str) -> str:
    t = text.lower()
    if _TEMPERATURE_UNITS.search(t):
        return "temperature_unit"
    if _UNITS.search(t):
        return "units"
    return ""


def _g(m: linear_regex.Match, name: str = "x") -> str:
    return _clip(m.group(name))


_VAGUE = frozenset({"it", "that", "this", "them", "him", "her", "you", "one", "so", "too", "a lot", "to"})


def _pref_render(verb: str) -> Callable[[linear_regex.Match], str | None]:
    def render(m: linear_regex.Match) -> str | None:
        x = _g(m)
        # "I love it" says nothing on its own: without the antecedent there is no memory.
        return f"User {verb} {x}." if x and x.lower() not in _VAGUE else None

    return render


_I = r"(?:i|i'm|im|i am)"
_RULES: tuple[_Rule, ...] = (
    # --- instructions (checked first: "always use metric" is an instruction, not a preference)
    _Rule(
        linear_regex.compile(
            r"^(?:please\s+)?(?:from now on|going forward|in future|in the future)[,:]?\s+(?P<x>.+)",
            ignore_case=True,
        ),
        MemoryKind.INSTRUCTION,
        lambda m: f"From now on: {_g(m)}." if _g(m) else None,
        slot=lambda m: _units_slot(m.group("x")),
        importance=0.8,
    ),
    _Rule(
        linear_regex.compile(
            r"^(?:please\s+)?(?:always|never|don't ever|do not ever|never ever)\s+(?P<x>.+)", ignore_case=True
        ),
        MemoryKind.INSTRUCTION,
        lambda m: (
            f"{m.group(0).split()[0 if not m.group(0).lower().startswith('please') else 1].capitalize()}"
            f" {_g(m)}."
            if _g(m)
            else None
        ),
        slot=lambda m: _units_slot(m.group("x")),
        importance=0.8,
    ),
    _Rule(
        linear_regex.compile(
            r"^(?:please\s+)?(?:use|give me|show|answer in|reply in|respond in)\s+"
            r"(?P<x>(?:the\s+)?(?:metric|imperial|celsius|fahrenheit)\b.*)",
            ignore_case=True,
        ),
        MemoryKind.INSTRUCTION,
        lambda m: f"Use {_g(m)}.",
        slot=lambda m: _units_slot(m.group("x")),
        importance=0.8,
    ),
    # --- personal facts
    _Rule(
        linear_regex.compile(
            r"\b(?i:my name is|my name's|call me|i go by)\s+(?P<x>[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*){0,2})"
        ),
        MemoryKind.FACT,
        lambda m: f"User's name is {_g(m)}.",
        slot="name",
        importance=0.9,
    ),
    _Rule(
        linear_regex.compile(
            rf"\b(?i:{_I}\s+(?:now\s+)?(?:living|based|located|staying)\s+in|i\s+(?:now\s+)?live\s+in|"
            rf"{_I}\s+(?:just\s+)?(?:moved|relocated)\s+to|i\s+(?:just\s+|"
            rf"recently\s+)?(?:moved|relocated)\s+to|"
            r"i(?:'ve| have) (?:just )?moved to)\s+(?P<x>[A-Z][\w'-]*(?:[\s,]+[A-Z][\w'-]*){0,3})"
        ),
        MemoryKind.FACT,
        lambda m: f"User lives in {_g(m)}.",
        slot="location",
        importance=0.9,
    ),
    _Rule(
        linear_regex.compile(
            rf"\b(?i:{_I}\s+from|i\s+grew up in|i was born in)\s+"
            r"(?P<x>[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*){0,3})"
        ),
        MemoryKind.FACT,
        lambda m: f"User is from {_g(m)}." if _g(m).lower() not in _NOT_PLACES else None,
        slot="hometown",
        importance=0.7,
    ),
    _Rule(
        linear_regex.compile(
            rf"\b(?:i work as|{_I}\s+working as|my job is|my role is|{_I}\s+employed as)\s+(?P<x>.+)",
            ignore_case=True,
        ),
        MemoryKind.FACT,
        lambda m: f"User works as {_g(m)}.",
        slot="job",
        importance=0.8,
    ),
    _Rule(
        linear_regex.compile(
            rf"\b(?:i work (?:at|for)|{_I}\s+working (?:at|for)|{_I}\s+employed (?:at|by))\s+(?P<x>.+)",
            ignore_case=True,
        ),
        MemoryKind.FACT,
        lambda m: f"User works at {_g(m)}.",
        slot="employer",
        importance=0.8,
    ),
    _Rule(
        linear_regex.compile(
            r"\b(?:i'm|i am|im)\s+an?\s+(?P<x>(?:[\w-]+\s+){0,2}(?:engineer|developer|doctor|nurse|teacher|"
            r"designer|manager|lawyer|student|scientist|researcher|architect|accountant|consultant|"
            r"analyst|writer|chef|pilot|programmer|professor|founder|ceo|cto|pharmacist|dentist|"
            r"photographer|artist|musician|farmer|electrician|plumber|mechanic|journalist|editor))\b",
            ignore_case=True,
        ),
        MemoryKind.FACT,
        lambda m: f"User is a {_g(m)}.",
        slot="job",
        importance=0.8,
    ),
    _Rule(
        linear_regex.compile(
            r"\b(?i:my)\s+(?P<rel>(?i:wife|husband|partner|son|daughter|"
            r"mother|mom|mum|father|dad|brother|sister|"
            r"girlfriend|boyfriend|fianc[ée]e?|kid|child|baby|dog|cat|grandmother|grandfather))(?i:'s name)?"
            r"\s+(?i:is called|is named|'s called|'s named|is|named)\s+"
            r"(?P<x>[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)?)"
        ),
        MemoryKind.FACT,
        lambda m: f"User's {m.group('rel').lower()} is named {_g(m)}.",
        importance=0.7,
    ),
    _Rule(
        linear_regex.compile(
            r"\bi have (?P<x>(?:a|an|one|two|three|four|five|\d+)\s+(?:kids?|children|sons?|daughters?|"
            r"brothers?|sisters?|siblings?|dogs?|cats?|pets?)(?:\s+named\s+[A-Z][\w'-]*)?)",
            ignore_case=True,
        ),
        MemoryKind.FACT,
        lambda m: f"User has {_g(m)}.",
        importance=0.6,
    ),
    _Rule(
        linear_regex.compile(
            rf"\b{_I}\s+(?:a\s+)?(?P<x>vegetarian|vegan|pescatarian|pescetarian|keto|gluten[- ]free|"
            r"lactose[- ]intolerant|halal|kosher)\b",
            ignore_case=True,
        ),
        MemoryKind.FACT,
        lambda m: f"User is {m.group('x').lower()}.",
        slot="diet",
        importance=0.8,
    ),
    _Rule(
        linear_regex.compile(rf"\b{_I}\s+allergic to\s+(?P<x>.+)", ignore_case=True),
        MemoryKind.FACT,
        lambda m: f"User is allergic to {_g(m)}.",
        importance=0.9,
    ),
    _Rule(
        linear_regex.compile(r"\bi (?:don't|do not|never) eat\s+(?P<x>.+)", ignore_case=True),
        MemoryKind.FACT,
        lambda m: f"User does not eat {_g(m)}.",
        importance=0.8,
    ),
    # --- units and other preferences
    _Rule(
        linear_regex.compile(
            r"\bi (?:prefer|like|use|want|work in|think in)\s+(?P<x>(?:the\s+)?(?:metric|imperial|celsius|"
            r"fahrenheit)\b.*)",
            ignore_case=True,
        ),
        MemoryKind.PREFERENCE,
        lambda m: f"User prefers {_g(m)}.",
        slot=lambda m: _units_slot(m.group("x")),
        importance=0.8,
    ),
    _Rule(
        linear_regex.compile(
            r"\bmy (?:favou?rite|fave)\s+(?P<what>[\w ]{2,30}?)\s+(?:is|are)\s+(?P<x>.+)", ignore_case=True
        ),
        MemoryKind.PREFERENCE,
        lambda m: f"User's favorite {m.group('what').strip().lower()} is {_g(m)}.",
        slot=lambda m: "favorite:" + m.group("what").strip().lower(),
        importance=0.6,
    ),
    _Rule(
        linear_regex.compile(
            r"\bi (?:really |much |would )?(?:prefer|rather have)\s+(?P<x>.+)", ignore_case=True
        ),
        MemoryKind.PREFERENCE,
        _pref_render("prefers"),
        importance=0.6,
    ),
    _Rule(
        linear_regex.compile(
            r"\bi (?:really |absolutely )?(?:love|like|enjoy|am a fan of|adore)\s+(?P<x>.+)", ignore_case=True
        ),
        MemoryKind.PREFERENCE,
        _pref_render("likes"),
        importance=0.6,
    ),
    _Rule(
        linear_regex.compile(
            r"\bi (?:really )?(?:hate|dislike|can't stand|cannot stand|don't like|do not like|detest)"
            r"\s+(?P<x>.+)",
            ignore_case=True,
        ),
        MemoryKind.PREFERENCE,
        _pref_render("dislikes"),
        importance=0.6,
    ),
    # --- decisions
    _Rule(
        linear_regex.compile(
            r"\b(?:we|i)(?:'ve| have)?\s+(?:decided|agreed|chose|chosen|settled on|picked)"
            r"\s+(?:to\s+|on\s+)?(?P<x>.+)",
            ignore_case=True,
        ),
        MemoryKind.FACT,
        lambda m: f"Decision: {_g(m)}." if _g(m) else None,
        importance=0.7,
    ),
    _Rule(
        linear_regex.compile(
            r"\b(?:let's|let us|we'll|we will|i'll|i will)\s+go with\s+(?P<x>.+)", ignore_case=True
        ),
        MemoryKind.FACT,
        lambda m: f"Decision: go with {_g(m)}." if _g(m) else None,
        importance=0.7,
    ),
)


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in linear_regex.cut(_SENTENCE, text) if s and s.strip()]


def _slot(rule: _Rule, m: linear_regex.Match) -> str:
    return rule.slot(m) if callable(rule.slot) else rule.slot


class RulesExtractor:
    """Implements ``Extractor``. Stateless and deterministic: the same messages give the same items."""

    @property
    def provider(self) -> str:
        return PROVIDER

    async def extract(self, messages: list[Message], session: Session) -> ExtractionResult:
        # Regexes over a whole session's turns: a thread, so the event loop keeps serving meanwhile.
        return await asyncio.to_thread(self.extract_sync, messages)

    def extract_sync(self, messages: list[Message]) -> ExtractionResult:
        result = ExtractionResult()
        for msg in messages:
            if msg.role is not Role.USER or msg.transient or not msg.content.strip():
                continue
            speaker = speaker_of(msg)
            for said in _sentences(msg.content[:MAX_MESSAGE_CHARS]):
                if is_chitchat(said) or is_question(said):
                    continue
                sentence = plain_sentence(said)
                if find_pii(sentence):
                    # What surrounds personal data is usually about it ("my email is x, I love it").
                    result.rejected_pii += 1
                    continue
                taken: list[tuple[int, int]] = []
                for rule in _RULES:
                    m = rule.pattern.search(sentence)
                    if m is None or any(s < m.end() and m.start() < e for s, e in taken):
                        continue
                    content = rule.render(m)
                    if not content or len(content) < 12:
                        continue
                    # Whose it is: a named speaker's fact names them, not "User".
                    content = attributed(content, speaker)
                    # Several facts may share a sentence ("I live in Pune and prefer metric"), but a
                    # span claimed by a more specific rule is not re-read by a looser one.
                    taken.append((m.start(), m.end()))
                    result.memories.append(
                        ExtractedMemory(
                            kind=rule.kind,
                            content=content,
                            keywords=keywords(content),
                            slot=_slot(rule, m),
                            importance=rule.importance,
                            source_message_ids=[msg.message_id],
                            occurred_at_ms=msg.created_at_ms,
                            metadata={
                                **subject_metadata(speaker),
                                **time_metadata(resolve(said, msg.created_at_ms)),
                            },
                        )
                    )
        return screen(result)


# --- Whose a fact is, and the sentence forms the first-person rules read.

SUBJECT_KEY = "subject"  # ltm.ingest.SUBJECT_KEY (extraction does not import ltm)
_PLACEHOLDER = "User"

# "I now prefer", "I still live in", "I actually work at": an adverb between the subject and its verb
# says when or how sure, not what; the rules read the sentence without it. The fact it states is the
# same either way, and whether it replaces an older one is decided by what it says (ltm/conflicts.py).
_ADVERB = linear_regex.compile(
    r"\b(i|we)\s+(?:now|still|actually|currently|really|also|generally|usually|mostly|definitely|"
    r"honestly|nowadays|these days)\s+([a-z])",
    ignore_case=True,
)


def plain_sentence(sentence: str) -> str:
    # The verb's first letter is read (RE2 has no lookahead) and put back.
    return _ADVERB.sub(lambda m: f"{m.group(1)} {m.group(2)}", sentence)


def speaker_of(msg: Message) -> str:
    """The named speaker of a user turn, or "" for the user the session belongs to."""
    return msg.participant_name.strip()


def attributed(content: str, speaker: str) -> str:
    """``content`` about "User" rewritten about ``speaker`` ("User's sister" -> "Ana's sister")."""
    if not speaker or not content.startswith(_PLACEHOLDER):
        return content
    return speaker + content[len(_PLACEHOLDER) :]


def subject_metadata(speaker: str) -> dict[str, str]:
    return {SUBJECT_KEY: speaker} if speaker else {}
