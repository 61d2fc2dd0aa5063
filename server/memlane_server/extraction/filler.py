"""Turns with nothing to recall: not stored as memories (they stay in the session and its archive).

A recalled filler turn takes a place and part of the token budget from a turn that answers, and
costs an embedding at ingest. Filler is:

- small talk (``picky.is_small_talk``: greetings, thanks, pleasantries);
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

import hashlib

from .keywords import keywords
from .picky import is_small_talk, normalized

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
