"""How session documents and messages are laid out in Redis.

Messages are compact JSON (orjson) with defaults omitted: they are read far more often than written and
the hot path decodes twenty at a time. The session document is a HASH so counters can be bumped in place.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import orjson

from .model import (
    ArchivePointer,
    ChannelPolicy,
    Message,
    PromotionState,
    Retirement,
    Role,
    ScopedSummary,
    Session,
    SessionStatus,
    Summary,
    Topology,
    VisibilityKind,
)

FINGERPRINT_LEN = 16  # hex chars stored in front of each message payload


def fingerprint(client_fields: dict[str, Any]) -> str:
    """A stable digest of what the client sent, so a retry is told apart from a reused id."""
    raw = orjson.dumps(client_fields, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(raw, digest_size=FINGERPRINT_LEN // 2).hexdigest()


def encode_message(m: Message) -> bytes:
    d: dict[str, Any] = {"r": int(m.role), "c": m.content, "t": m.created_at_ms, "n": m.token_count}
    if m.source_agent_id:
        d["a"] = m.source_agent_id
    if m.participant_name:
        d["p"] = m.participant_name
    if m.user_id:
        d["u"] = m.user_id
    if m.channel:
        d["ch"] = m.channel
    if m.native_format or m.native_json:
        d["nf"] = m.native_format
        d["nj"] = m.native_json
    if m.planning_steps:
        d["ps"] = m.planning_steps
    if m.invoked:
        d["iv"] = m.invoked
    if m.tool_call_ids:
        d["tc"] = m.tool_call_ids
    if m.metadata:
        d["md"] = m.metadata
    if m.transient:
        d["tr"] = 1
    if m.visibility != VisibilityKind.SESSION:
        d["v"] = int(m.visibility)
    if m.visibility_group:
        d["vg"] = m.visibility_group
    return orjson.dumps(d)


def decode_message(session_id: str, message_id: str, seq: int, payload: bytes) -> Message:
    d = orjson.loads(payload[FINGERPRINT_LEN:])
    return Message(
        message_id=message_id,
        session_id=session_id,
        role=Role(d["r"]),
        content=d["c"],
        seq=seq,
        source_agent_id=d.get("a", ""),
        participant_name=d.get("p", ""),
        user_id=d.get("u", ""),
        channel=d.get("ch", ""),
        native_format=d.get("nf", ""),
        native_json=d.get("nj", ""),
        planning_steps=d.get("ps", []),
        invoked=d.get("iv", []),
        tool_call_ids=d.get("tc", []),
        metadata=d.get("md", {}),
        transient=bool(d.get("tr", 0)),
        visibility=VisibilityKind(d.get("v", VisibilityKind.SESSION)),
        visibility_group=d.get("vg", ""),
        created_at_ms=d["t"],
        token_count=d["n"],
    )


# Session document: scalar fields are stored as their own hash fields (the Lua scripts read and bump
# some of them); lists and maps as JSON.
_INT_FIELDS = (
    "created_at_ms",
    "last_activity_at_ms",
    "idle_at_ms",
    "closed_at_ms",
    "expired_at_ms",
    "token_total",
    "message_count",
    "last_seq",
    "ttl_seconds",
)
_STR_FIELDS = ("user_id", "agent_id", "channel", "group", "model")
_JSON_FIELDS = ("participants", "tags", "metadata")


def encode_session(s: Session) -> dict[str, str | int]:
    out: dict[str, str | int] = {f: getattr(s, f) for f in _STR_FIELDS + _INT_FIELDS}
    for f in _JSON_FIELDS:
        out[f] = orjson.dumps(getattr(s, f)).decode()
    out["session_id"] = s.session_id
    out["status"] = int(s.status)
    out["promotion_state"] = int(s.promotion_state)
    out["topology"] = int(s.topology)
    out.update(encode_summary(s.summary))
    out.update(encode_lifecycle(s.policy, s.retirement, s.resumed_at_ms))
    return out


# --- the lifecycle's state: each part in its own field of the document.
# Documents written before these fields kept them all inside one JSON field, ``extra``, under the keys
# of _LEGACY. Decoding migrates such a document (``extra`` present means the old layout: every write of
# these fields deletes it), and the next lifecycle write stores the new layout.
LEGACY_FIELD = "extra"
_LEGACY = {
    "policy": "policy",
    "retired_at_ms": "retired_at_ms",
    "archives": "archive",
    "checkpoints_uri": "checkpoints_archive",
    "resumed_at_ms": "resumed_at_ms",
}
RETIREMENT_FIELDS = ("retired_at_ms", "archives", "checkpoints_uri")
LIFECYCLE_FIELDS = ("policy", *RETIREMENT_FIELDS, "resumed_at_ms")


def encode_lifecycle(
    policy: ChannelPolicy | None, retirement: Retirement | None, resumed_at_ms: int
) -> dict[str, str | int]:
    """The fields to set (absent ones are to be deleted: ``LIFECYCLE_FIELDS`` minus these keys)."""
    out: dict[str, str | int] = {}
    if policy is not None:
        out["policy"] = orjson.dumps(policy.to_record()).decode()
    if retirement is not None:
        out["retired_at_ms"] = retirement.retired_at_ms
        out["archives"] = orjson.dumps([p.to_record() for p in retirement.archives]).decode()
        out["checkpoints_uri"] = retirement.checkpoints_uri
    if resumed_at_ms:
        out["resumed_at_ms"] = resumed_at_ms
    return out


def _lifecycle_values(g: dict[str, str]) -> dict[str, Any]:
    """The lifecycle fields present, decoded, from either layout."""
    if LEGACY_FIELD in g:
        legacy = orjson.loads(g[LEGACY_FIELD] or "{}")
        legacy = legacy if isinstance(legacy, dict) else {}
        return {name: legacy[old] for name, old in _LEGACY.items() if old in legacy}
    out: dict[str, Any] = {n: g[n] for n in LIFECYCLE_FIELDS if g.get(n)}
    if "archives" in out:
        out["archives"] = orjson.loads(out["archives"])
    return out  # "policy" stays JSON text: _policy decodes it through a cache


def decode_policy(g: dict[str, str]) -> ChannelPolicy | None:
    """The recorded policy, from the document's fields (all of them, or ``policy`` and ``extra``)."""
    return _policy(_lifecycle_values(g))


def decode_retirement(g: dict[str, str]) -> Retirement | None:
    """The retirement record, from the document's fields (all, or the retirement ones and ``extra``)."""
    return _retirement(_lifecycle_values(g))


def _policy(v: dict[str, Any]) -> ChannelPolicy | None:
    record = v.get("policy")
    if isinstance(record, str):
        return _policy_of_json(record)
    return ChannelPolicy.from_record(record) if isinstance(record, dict) else None


@functools.lru_cache(maxsize=1024)
def _policy_of_json(text: str) -> ChannelPolicy | None:
    """Sessions of one channel share one stored policy text, and building a policy costs more than the
    rest of a document's decoding: decoded once per text (a frozen value, safe to share)."""
    record = orjson.loads(text)
    return ChannelPolicy.from_record(record) if isinstance(record, dict) else None


def _retirement(v: dict[str, Any]) -> Retirement | None:
    retired = int(v.get("retired_at_ms") or 0)
    if not retired:
        return None
    records = v.get("archives")
    return Retirement(
        retired_at_ms=retired,
        archives=[ArchivePointer.from_record(r) for r in records if isinstance(r, dict)]
        if isinstance(records, list)
        else [],
        checkpoints_uri=str(v.get("checkpoints_uri") or ""),
    )


def encode_summary(summary: Summary) -> dict[str, str | int]:
    return {
        "summary_text": summary.text,
        "summary_through_id": summary.through_message_id,
        "summary_through_seq": summary.through_seq,
        "summary_tokens": summary.token_count,
        "summary_updated_at_ms": summary.updated_at_ms,
        # Always written (also when empty): a new summary replaces every scope's part at once.
        "summary_scoped": orjson.dumps(
            [[int(p.visibility), p.agent_id, p.group, p.text, p.token_count] for p in summary.scoped]
        ).decode(),
    }


def _decode_scoped(raw: str) -> list[ScopedSummary]:
    if not raw:
        return []
    return [
        ScopedSummary(VisibilityKind(int(vis)), str(agent), str(group), str(text), int(tokens))
        for vis, agent, group, text, tokens in orjson.loads(raw)
    ]


def decode_session(h: dict[bytes, bytes]) -> Session:
    g = {k.decode(): v.decode() for k, v in h.items()}
    s = Session(session_id=g["session_id"], user_id=g["user_id"])
    for f in _STR_FIELDS:
        setattr(s, f, g.get(f, ""))
    for f in _INT_FIELDS:
        setattr(s, f, int(g.get(f, 0) or 0))
    for f in _JSON_FIELDS:
        if f in g:
            setattr(s, f, orjson.loads(g[f]))
    s.status = SessionStatus(int(g.get("status", SessionStatus.ACTIVE)))
    s.promotion_state = PromotionState(int(g.get("promotion_state", PromotionState.NONE)))
    s.topology = Topology(int(g.get("topology", Topology.SHARED)))
    s.summary = Summary(
        text=g.get("summary_text", ""),
        through_message_id=g.get("summary_through_id", ""),
        through_seq=int(g.get("summary_through_seq", 0) or 0),
        token_count=int(g.get("summary_tokens", 0) or 0),
        updated_at_ms=int(g.get("summary_updated_at_ms", 0) or 0),
        scoped=_decode_scoped(g.get("summary_scoped", "")),
    )
    lifecycle = _lifecycle_values(g)
    s.policy = _policy(lifecycle)
    s.retirement = _retirement(lifecycle)
    s.resumed_at_ms = int(lifecycle.get("resumed_at_ms") or 0)
    return s
