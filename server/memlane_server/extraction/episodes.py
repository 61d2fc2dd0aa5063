"""Episodic items: what was said when, so "what did we talk about / when did X happen" can be recalled.

One episode per exchange: a user turn and the assistant turn(s) answering it (a small window, not the
whole session, so each episode stays specific). The content is keyed for both retrievers: the date
in words and ISO form, the speakers, the text (PII redacted), then extracted keywords. An episode
claims only the turns whose text it carries.
"""

from __future__ import annotations

import datetime as dt

from memlane_server.extraction.keywords import keywords
from memlane_server.extraction.model import KIND_EPISODIC, ExtractedMemory
from memlane_server.extraction.pii import redact
from memlane_server.sessions.model import Message, Role, Session

_SPOKEN = (Role.USER, Role.ASSISTANT)
MAX_TURN_CHARS = 600


def _speaker(msg: Message) -> str:
    if msg.participant_name:
        return msg.participant_name
    return "User" if msg.role is Role.USER else "Assistant"


def _date_words(ms: int) -> str:
    if ms <= 0:
        return ""
    day = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return f"{day:%Y-%m-%d} ({day:%A %d %B %Y})"


def build_episodes(messages: list[Message], session: Session, *, max_turns: int = 3) -> list[ExtractedMemory]:
    """Group spoken turns into exchanges starting at each user turn (at most ``max_turns`` each)."""
    spoken = [m for m in messages if m.role in _SPOKEN and not m.transient and m.content.strip()]
    windows: list[list[Message]] = []
    for msg in spoken:
        if msg.role is Role.USER or not windows or len(windows[-1]) >= max_turns:
            windows.append([msg])
        else:
            windows[-1].append(msg)
    episodes: list[ExtractedMemory] = []
    for window in windows:
        lines = [f"{_speaker(m)}: {redact(m.content.strip())[:MAX_TURN_CHARS]}" for m in window]
        body = "\n".join(lines)
        when = window[0].created_at_ms or session.created_at_ms
        date = _date_words(when)
        content = f"[{date}] {body}" if date else body
        episodes.append(
            ExtractedMemory(
                kind=KIND_EPISODIC,
                content=content,
                keywords=keywords(body, limit=16),
                importance=0.3,
                source_message_ids=[m.message_id for m in window],
                occurred_at_ms=when,
            )
        )
    return episodes
