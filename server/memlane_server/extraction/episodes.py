"""Episodic items: what was said when, so "what did we talk about / when did X happen" can be recalled.

One episode per spoken turn. Recall is paid for in tokens (assembly injects what it finds into a
budget), so an episode holds exactly one turn: a window of several turns would spend the budget on
turns that merely sit next to the relevant one. The content is what an agent reads: the date, the
speaker and the turn's text (PII redacted). An episode claims only that turn as its source.

What the turn means often lives next to it ("Yes, last week!" answers "Did you finish the
marathon?"), so the neighbouring turns' keywords, the speaker and the date in several spellings go
into the episode's keywords: keys that both retrievers see (the full-text index reads them, the
embedding is computed over content plus keywords) but that are never served as content.
"""

from __future__ import annotations

import datetime as dt

from ..memory_kinds import MemoryKind
from ..sessions.model import Message, Role, Session
from .attribution import subject_metadata
from .filler import adds_to, heard_words, is_filler, repeat_key
from .keywords import keywords
from .model import ExtractedMemory
from .picky import is_small_talk
from .pii import redact_head
from .when import resolve, time_keys, time_metadata

_SPOKEN = (Role.USER, Role.ASSISTANT)
MAX_TURN_CHARS = 1200
# A turn longer than this is never small talk; the small-talk patterns read no further.
SMALL_TALK_MAX_CHARS = 400
# Keys: the turn's own keywords first (they are what it is about), then its neighbours'. The turn
# before counts most: a reply is about what it answers.
OWN_KEYWORDS = 12
PREVIOUS_KEYWORDS = 10
NEXT_KEYWORDS = 6


def _speaker(msg: Message) -> str:
    if msg.participant_name:
        return msg.participant_name
    return "User" if msg.role is Role.USER else "Assistant"


def _day(ms: int) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC) if ms > 0 else None


def date_keys(ms: int) -> list[str]:
    """The ways a question names a day: ISO date, weekday, month name, year."""
    day = _day(ms)
    if day is None:
        return []
    return [f"{day:%Y-%m-%d}", f"{day:%A}", f"{day:%B}", f"{day:%Y}"]


def build_episodes(messages: list[Message], session: Session) -> list[ExtractedMemory]:
    """One episode per spoken turn, keyed with its neighbours' keywords, the speaker and the date."""
    # Greetings and pleasantries take no part. Filler (bare questions and reactions: filler.py) and a
    # speaker's exact repeats are no episodes (recalled, they crowd out the turns that answer, and each
    # would cost an embedding), but they still key their neighbours: a bare question's words are how
    # its answer is found.
    spoken = [
        m
        for m in messages
        if m.role in _SPOKEN
        and not m.transient
        and m.content.strip()
        and not (len(m.content) <= SMALL_TALK_MAX_CHARS and is_small_talk(m.content))
    ]
    said: set[str] = set()
    heard: set[str] = set()  # the user's words so far: what an assistant's echo would repeat
    kept: list[bool] = []
    for m in spoken:
        key = repeat_key(_speaker(m), m.content)
        keep = key not in said and not is_filler(m.content)
        if m.role is Role.USER:
            heard |= heard_words(m.content)
        elif keep:
            keep = adds_to(m.content, heard)
        kept.append(keep)
        said.add(key)
    # Cut before redacting: the patterns read a few hundred characters past the cut, not a 256 KB turn.
    texts = [redact_head(m.content.strip(), MAX_TURN_CHARS) for m in spoken]
    own = [keywords(t, limit=OWN_KEYWORDS) for t in texts]
    episodes: list[ExtractedMemory] = []
    for i, msg in enumerate(spoken):
        if not kept[i]:
            continue
        when = msg.created_at_ms or session.created_at_ms
        day = _day(when)
        speaker = _speaker(msg)
        line = f"{speaker}: {texts[i]}"
        content = f"[{day:%-d %B %Y}] {line}" if day else line
        neighbours = [
            kw
            for j, n in ((i - 1, PREVIOUS_KEYWORDS), (i + 1, NEXT_KEYWORDS))
            if 0 <= j < len(spoken)
            for kw in own[j][:n]
        ]
        # Relative times ("last May") resolved against the turn's day: keys right after its own date.
        times = resolve(texts[i], when)
        episodes.append(
            ExtractedMemory(
                kind=MemoryKind.EPISODIC,
                content=content,
                keywords=list(
                    dict.fromkeys([speaker, *date_keys(when), *time_keys(times), *own[i], *neighbours])
                ),
                importance=0.3,
                source_message_ids=[msg.message_id],
                occurred_at_ms=when,
                metadata={**subject_metadata(msg.participant_name), **time_metadata(times)},
            )
        )
    return episodes
