"""Episodic items: what was said when, so "what did we talk about / when did X happen" can be recalled;
and filler, the turns that key their neighbours but are no episode themselves (its section below).

One episode per spoken turn. Recall is paid for in tokens (assembly injects what it finds into a
budget), so an episode holds exactly one turn: a window of several turns would spend the budget on
turns that merely sit next to the relevant one. The content is what an agent reads: the date, the
speaker and the turn's text (PII redacted). An episode claims only that turn as its source.

What the turn means often lives next to it ("Yes, last week!" answers "Did you finish the
marathon?"), so the neighbouring turns' keywords, the speaker and the date in several spellings go
into the episode's keywords: keys that both retrievers see (the full-text index reads them, the
embedding is computed over content plus keywords) but that are never served as content.

Turns with nothing to recall: not stored as memories (they stay in the session and its archive).

A recalled filler turn takes a place and part of the token budget from a turn that answers, and
costs an embedding at ingest. Filler is:

- small talk (``extractor.is_small_talk``: greetings, thanks, pleasantries);
- a bare question: at most two words that say something and no name or number ("How was your
  weekend?", "What about you?"); what a question asks is recalled through its answer, which carries
  the question's keywords as its own keys (episodes.py);
- a bare reaction: a statement of appraisal with at most one other word that says something
  ("That's awesome!", "Wow, that sounds amazing!"); "I will pack" is not one.

"Words that say something" are ``keywords`` (names, numbers, content words) minus words of reaction
and appraisal. A reply that starts with yes or no is never filler: it may answer the turn before it.

An assistant's turn is kept only when it states what the user did not (``adds_to``): a name, a number
or an id of its own (a booking number, a tool's result), or a few words of its own (a decision, an
answer). Service phrases ("Sure, I can help with that", "Let me check") and an echo of what the user
said ("You live in Berlin, got it") are not: the user's own turn is the memory.
"""

from __future__ import annotations

import datetime as dt
import hashlib

from ..memory_kinds import MemoryKind
from ..sessions.model import Message, Role, Session
from .extractor import ExtractedMemory, is_small_talk, normalized
from .keywords import keywords
from .pii import redact_head
from .rules import subject_metadata
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
    # Greetings and pleasantries take no part. Filler (bare questions and reactions: see below) and a
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


# --- Turns with nothing to recall: not stored as memories (they stay in the session and its archive).

_REACTION = frozenset({
    "wow", "awesome", "amazing", "great", "cool", "nice", "sounds", "sound", "lovely", "wonderful",
    "fantastic", "incredible", "glad", "happy", "totally", "really", "true", "agree", "exactly", "haha",
    "lol", "omg", "yay", "congrats", "congratulations", "fun", "beautiful", "sweet", "super", "good",
    "oh", "ooh", "ah", "aww", "hmm", "brilliant", "excellent", "perfect", "interesting",
    "thanks", "thank", "sorry", "hear", "love", "cute", "impressive", "inspiring", "crazy", "wild",
})  # fmt: skip
# The words an assistant serves with, not about anything: what is left of "Of course, let me look into
# that for you" once they are set aside is nothing.
_SERVICE = frozenset({
    "help", "check", "look", "course", "absolutely", "certainly", "moment", "assist", "happy", "glad",
    "question", "anything", "else", "today", "okay", "right", "away", "hold", "please", "wait",
    "understand", "see", "back", "find", "noted", "sounds", "let", "into", "got",
    # Acknowledging what the user asked for, without adding to it ("Understood, no snacks will be
    # included.", "That has been taken care of.", "Your request has been updated accordingly."): what
    # is asked for is the user's turn, which is kept.
    "understood", "include", "included", "including", "taken", "care", "request", "requested", "update",
    "updated", "accordingly", "welcome", "you're", "make", "sure", "done", "alright", "perfect", "great",
})  # fmt: skip
# An assistant turn with fewer new content words than this (and no name, number or id of its own)
# adds nothing to what the user said.
MIN_NEW_WORDS = 2
_ANSWERS = ("yes", "yeah", "yep", "no", "nope", "sure")
MAX_QUESTION_WORDS = 2
MAX_REACTION_WORDS = 1


def _saying(text: str) -> list[str]:
    return [k for k in keywords(text, limit=64) if k.lower() not in _REACTION]


def is_filler(text: str) -> bool:
    t = text.strip()
    if not t:
        return False
    if is_small_talk(t):
        return True
    first = normalized(t).split(maxsplit=1)[:1]
    if first and first[0] in _ANSWERS:
        return False
    words = _saying(t)
    if "?" in t:
        # A question is recalled through its answer, unless it names something itself (a name, a
        # number: "Did you go to the Pride parade?").
        named = any(w[:1].isupper() or w[:1].isdigit() for w in words)
        return not named and len(words) <= MAX_QUESTION_WORDS
    reacts = len(words) < len(keywords(t, limit=64))
    return not words or (reacts and len(words) <= MAX_REACTION_WORDS)


def adds_to(text: str, heard: set[str]) -> bool:
    """Whether an assistant's turn states something beyond ``heard`` (the user's words so far, lower
    case): a name, number or id of its own, or ``MIN_NEW_WORDS`` content words of its own."""
    new = [
        k
        for k in keywords(text, limit=64)
        if (low := k.lower()) not in heard and low not in _SERVICE and low not in _REACTION
    ]
    if any(k[:1].isupper() or any(ch.isdigit() for ch in k) for k in new):
        return True
    return len(new) >= MIN_NEW_WORDS


def heard_words(text: str) -> set[str]:
    """What ``adds_to`` counts as already said by the user, of one of their turns."""
    return {k.lower() for k in keywords(text, limit=64)}


def repeat_key(speaker: str, text: str) -> str:
    """Exact repeats (same speaker, same words whatever the case and punctuation) share this key."""
    return hashlib.blake2b(f"{speaker}\x1f{normalized(text)}".encode(), digest_size=12).hexdigest()
