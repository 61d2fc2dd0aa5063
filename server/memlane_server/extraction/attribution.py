"""Whose a fact is, and the sentence forms the first-person rules read.

Extractors write facts about "User"; in a conversation between named people (participants), "User"
would file two people's facts under one subject and the newer one would retire the other's. A fact
from a named speaker's turn names that speaker instead ("Ana lives in Lyon.") and carries the name as
its subject, which ingest compares before it merges or supersedes anything.
"""

from __future__ import annotations

from .. import linear_regex
from ..sessions.model import Message

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
