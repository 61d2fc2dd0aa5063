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


def repeat_key(speaker: str, text: str) -> str:
    """Exact repeats (same speaker, same words whatever the case and punctuation) share this key."""
    return hashlib.blake2b(f"{speaker}\x1f{normalized(text)}".encode(), digest_size=12).hexdigest()
