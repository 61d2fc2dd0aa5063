"""Channel policies: how long a session of a channel lives, how its context is built, what happens at its end.

A policy starts from a built-in kind and overrides fields; a file (YAML or TOML) names the channels::

    default:                 # optional: overrides for channels not listed below
      expire_after: 1h
    channels:
      web:   {kind: web_chat, expire_after: 20m, context_strategy: sliding_window, context_window_turns: 8}
      slack: {kind: messaging}
      jira:  {kind: internal_tool, work_item_key: ticket_id}
      voice: {learn: false}  # promote at session end only, not while the session is open

Durations are seconds (numbers) or strings with a unit (``90s``, ``15m``, ``1h``, ``7d``); 0 means "never"
(no time expiry, keep the archive forever). A policy that sets ``expire_after`` but not ``idle_after``
goes idle at the inherited ``idle_after`` or at its expiry, whichever comes first (``expire_after: 2m``
alone is idle after 2 minutes, not refused for the inherited 15); set both, and ``idle_after`` must
not exceed ``expire_after``. The resolved policy is recorded on the session document when
it is created, so editing the file later never changes what an existing session was promised.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from ..errors import InvalidArgument
from .model import CONTEXT_STRATEGIES, ChannelPolicy, Session

# ChannelPolicy is defined beside Session (the record a session keeps) and read here as the book's unit.
__all__ = ["BUILTIN_KINDS", "ChannelPolicy", "PolicyBook", "PolicyError", "parse_duration"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}


class PolicyError(ValueError):
    """The policy file is unusable; the message names the file, the channel and the field."""


def parse_duration(value: object, where: str) -> float:
    """Seconds from ``90``, ``"90s"``, ``"15m"``, ``"1h"``, ``"7d"``; ``"never"`` and 0 mean 0."""
    if isinstance(value, bool):
        raise PolicyError(f"{where}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip().lower() in ("never", "none", "off"):
        seconds = 0.0
    elif isinstance(value, str) and (m := _DURATION.match(value.lower())):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        raise PolicyError(f"{where}: cannot read {value!r} as a duration (e.g. 90, '15m', '1h', '7d')")
    if seconds < 0:
        raise PolicyError(f"{where}: must not be negative")
    return seconds


# The built-in kinds a channel starts from.
BUILTIN_KINDS: dict[str, ChannelPolicy] = {
    "default": ChannelPolicy(),
    # Asynchronous messaging (Slack, WhatsApp, email): people come back hours later; summary + resumption.
    "messaging": ChannelPolicy(
        kind="messaging",
        idle_after=3600.0,
        expire_after=3 * 86400.0,
        context_strategy="hybrid",
        context_window_turns=20,
        hot_retention=7 * 86400.0,
        archive_retention=365 * 86400.0,
        resume_turns=20,
    ),
    # Web chat: a visit; a sliding window is enough and the tab is gone after a short quiet spell.
    "web_chat": ChannelPolicy(
        kind="web_chat",
        idle_after=300.0,
        expire_after=1800.0,
        context_strategy="sliding_window",
        context_window_turns=12,
        hot_retention=3600.0,
        archive_retention=90 * 86400.0,
        resume_turns=12,
    ),
    # Internal tools: one session per work item, ended by an explicit close, never by the clock.
    "internal_tool": ChannelPolicy(
        kind="internal_tool",
        idle_after=3600.0,
        expire_after=0.0,
        context_strategy="hybrid",
        context_window_turns=20,
        hot_retention=86400.0,
        archive_retention=2 * 365 * 86400.0,
        work_item_key="ticket_id",
        resume_turns=20,
    ),
}

_DURATION_FIELDS = ("idle_after", "expire_after", "hot_retention", "archive_retention")


def _build(base: ChannelPolicy, channel: str, raw: Mapping[str, Any], where: str) -> ChannelPolicy:
    known = {f.name for f in fields(ChannelPolicy)} - {"channel"}
    values: dict[str, Any] = {}
    kind = raw.get("kind")
    if kind is not None:
        if kind not in BUILTIN_KINDS:
            raise PolicyError(f"{where}: unknown kind {kind!r}; known: {', '.join(sorted(BUILTIN_KINDS))}")
        base = BUILTIN_KINDS[str(kind)]
    for key, value in raw.items():
        if key == "kind":
            continue
        if key not in known:
            raise PolicyError(f"{where}: unknown field {key!r}; known: {', '.join(sorted(known))}")
        if key in _DURATION_FIELDS:
            values[key] = parse_duration(value, f"{where}.{key}")
        elif key in ("context_window_turns", "resume_turns"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PolicyError(f"{where}.{key}: expected a non-negative integer, got {value!r}")
            values[key] = value
        elif key == "context_strategy":
            if value not in ("", *CONTEXT_STRATEGIES):
                raise PolicyError(
                    f"{where}.context_strategy: unknown strategy {value!r}; "
                    f"known: {', '.join(CONTEXT_STRATEGIES)} (or empty for the server's context_strategy)"
                )
            values[key] = value
        elif key in ("promote", "learn"):
            if not isinstance(value, bool):
                raise PolicyError(f"{where}.{key}: expected true or false, got {value!r}")
            values[key] = value
        else:
            values[key] = str(value)
    if values.get("expire_after") and "idle_after" not in values:
        values["idle_after"] = min(base.idle_after, values["expire_after"])  # see the module's doc
    policy = dataclasses.replace(base, channel=channel, **values)
    if policy.expire_after and policy.idle_after > policy.expire_after:
        raise PolicyError(f"{where}: idle_after must not exceed expire_after")
    return policy


class PolicyBook:
    """The policies in force: the default plus one per configured channel."""

    def __init__(self, default: ChannelPolicy, channels: Mapping[str, ChannelPolicy] | None = None) -> None:
        self.default = default
        self.channels = dict(channels or {})

    @classmethod
    def load(cls, path: str | Path | None, *, default_expire_after: float) -> PolicyBook:
        """Reads the file (empty path: defaults only). ``default_expire_after`` is the server-wide
        session TTL, used by the default policy unless the file overrides it."""
        base = dataclasses.replace(
            BUILTIN_KINDS["default"],
            expire_after=float(default_expire_after),
            idle_after=min(BUILTIN_KINDS["default"].idle_after, float(default_expire_after) or float("inf")),
        )
        if not path:
            return cls(base)
        p = Path(path)
        try:
            text = p.read_text()
            data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
        except (OSError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
            raise PolicyError(f"channel policy file {p}: {exc}") from exc
        data = data or {}
        if not isinstance(data, dict) or set(data) - {"default", "channels"}:
            raise PolicyError(f"channel policy file {p}: expected a mapping with 'default' and 'channels'")
        for part in ("default", "channels"):
            if not isinstance(data.get(part) or {}, dict):
                raise PolicyError(f"{p}: {part}: expected a mapping")
        default = _build(base, "", data.get("default") or {}, f"{p}: default")
        channels: dict[str, ChannelPolicy] = {}
        for name, raw in (data.get("channels") or {}).items():
            if not isinstance(raw, dict):
                raise PolicyError(f"{p}: channels.{name}: expected a mapping")
            channels[str(name)] = _build(default, str(name), raw, f"{p}: channels.{name}")
        return cls(default, channels)

    def for_channel(self, channel: str) -> ChannelPolicy:
        policy = self.channels.get(channel)
        if policy is not None:
            return policy
        return dataclasses.replace(self.default, channel=channel)

    def for_session(self, session: Session) -> ChannelPolicy:
        """The policy recorded on the session at creation; the channel's current one for older sessions."""
        return session.policy if session.policy is not None else self.for_channel(session.channel)

    def apply(self, draft: Session) -> tuple[Session, int]:
        """Checks ``draft`` against its channel's policy and records the policy on it. Returns the draft
        and the TTL the store should use when the caller asked for none (0: no time expiry)."""
        policy = self.for_channel(draft.channel)
        if policy.work_item_key and not draft.metadata.get(policy.work_item_key):
            raise InvalidArgument(
                f"channel {draft.channel!r} binds every session to a work item: "
                f"metadata[{policy.work_item_key!r}] is required"
            )
        draft.policy = policy
        return draft, policy.expire_after_seconds
