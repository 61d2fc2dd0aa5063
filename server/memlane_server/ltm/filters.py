"""LanceDB predicates for memory reads and writes: the one place that builds them.

The rule: **no caller string ever appears in a predicate**. LanceDB lowers typed expressions to SQL
text on several paths (``update``, ``delete``, the transaction files that record a delete), and its
``to_sql()`` does not double a quote that follows a backslash, so a user id such as
``a\\')) OR true --`` would end the literal early. So every string column a predicate tests has a
companion *key column* holding the SHA-256 hex digest of the value (``user_key`` for ``user_id``,
...); predicates compare digests, and the only literals a predicate can hold are lowercase hex, the
fixed enum words of ``MemoryKind``/``MemoryScope``, the empty string and integers. ``store.checked``
verifies that on every call, so a predicate built any other way fails loudly instead of running.

Digests also keep user ids out of what LanceDB writes beside the rows (transaction files and
manifests record delete predicates). Every read filter starts from ``visible_to``, which always pins
``user_key``: that is the one rule that keeps users apart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from lancedb.expr import Expr, col, lit

from ..errors import InvalidArgument
from ..memory_kinds import MemoryKind, MemoryScope
from .model import MemoryFilter, Visibility

# Value column -> its digest column. The schema, the row writer and the migration all read this map.
KEY_COLUMNS: dict[str, str] = {
    "id": "id_key",
    "user_id": "user_key",
    "agent_id": "agent_key",
    "group": "group_key",
    "channel": "channel_key",
    "source_session_id": "session_key",
}


def key(value: str) -> str:
    """The digest stored in a key column (UTF-8 bytes; the migration computes the same in SQL)."""
    return hashlib.sha256(value.encode()).hexdigest()


def is_(column: str, value: str) -> Expr:
    """``column == value``, compared on the column's digest."""
    return col(KEY_COLUMNS[column]) == lit(key(value))


def among(column: str, values: list[str]) -> Expr:
    return col(KEY_COLUMNS[column]).isin([key(v) for v in values])


def _require(value: str, name: str) -> str:
    if not value:
        raise InvalidArgument(f"{name} is required")
    return value


def active(now_ms: int) -> Expr:
    """Not superseded and not past its validity: the only items recall and profile may serve."""
    return (col("superseded_by") == lit("")) & (
        (col("valid_until_ms") == lit(0)) | (col("valid_until_ms") > lit(int(now_ms)))
    )


def owned_by(user_id: str) -> Expr:
    return is_("user_id", _require(user_id, "user_id"))


def owned_by_any(user_ids: list[str]) -> Expr:
    """Rows stored under any of ``user_ids``: erasure's predicate, which names every stored form of one
    user's id (rows written before ids were normalized hold the id as its client sent it)."""
    return among("user_id", [_require(u, "user_id") for u in user_ids])


def visible_to(who: Visibility) -> Expr:
    """The user's items that this agent may read (see ``MemoryScope``); all of them for ``every_agent``."""
    if who.every_agent:
        return owned_by(who.user_id)
    # An agent's private items, including those of the unnamed agent ("") of a single-agent app that
    # never sets agent ids: its sessions promote episodes as agent-private to "".
    shared = col("scope").isin([MemoryScope.USER.value, MemoryScope.SHARED.value]) | (
        (col("scope") == lit(MemoryScope.AGENT.value)) & is_("agent_id", who.agent_id)
    )
    groups = [g for g in who.groups if g]
    if groups:
        shared = shared | ((col("scope") == lit(MemoryScope.GROUP.value)) & among("group", groups))
    return owned_by(who.user_id) & shared


def narrowed(base: Expr, flt: MemoryFilter, now_ms: int) -> Expr:
    expr = base
    if not flt.include_retired:
        expr = expr & active(now_ms)
    if flt.kinds:
        expr = expr & col("kind").isin([MemoryKind(k).value for k in flt.kinds])
    if flt.scopes:
        expr = expr & col("scope").isin([MemoryScope(s).value for s in flt.scopes])
    if flt.channel:
        expr = expr & is_("channel", flt.channel)
    if flt.episodes_from_channel is not None:
        # Durable facts follow the user everywhere; raw conversation (episodes) stays in its channel.
        expr = expr & (
            (col("kind") != lit(MemoryKind.EPISODIC.value)) | is_("channel", flt.episodes_from_channel)
        )
    if flt.episodes_not_from_session:
        expr = expr & (
            (col("kind") != lit(MemoryKind.EPISODIC.value))
            | (col(KEY_COLUMNS["source_session_id"]) != lit(key(flt.episodes_not_from_session)))
        )
    if flt.since_ms:
        expr = expr & (col("occurred_at_ms") >= lit(int(flt.since_ms)))
    if flt.until_ms:
        expr = expr & (col("occurred_at_ms") < lit(int(flt.until_ms)))
    return expr


# What ``narrowed_mask`` reads: the columns ``narrowed`` tests, as an in-memory index holds them.
MASK_COLUMNS = ["kind", "scope", "channel_key", "session_key", "occurred_at_ms", "valid_until_ms"]


def narrowed_mask(
    cols: Mapping[str, npt.NDArray[Any]], flt: MemoryFilter, now_ms: int
) -> npt.NDArray[np.bool_]:
    """``narrowed`` over rows held in memory (``ltm.hot``), for rows already loaded with
    ``visible_to(who)`` and not superseded: the same rule, kept beside it so that both change together
    (tests/integration/test_ltm_hot_index.py holds them equal). Retired items are never held, so a
    filter that includes them is not served from memory (``include_retired`` raises)."""
    if flt.include_retired:
        raise ValueError("retired items are not held in memory")
    valid_until = cols["valid_until_ms"]
    mask: npt.NDArray[np.bool_] = (valid_until == 0) | (valid_until > int(now_ms))
    kind, scope, channel = cols["kind"], cols["scope"], cols["channel_key"]
    if flt.kinds:
        mask &= np.isin(kind, [MemoryKind(k).value for k in flt.kinds])
    if flt.scopes:
        mask &= np.isin(scope, [MemoryScope(s).value for s in flt.scopes])
    if flt.channel:
        mask &= channel == key(flt.channel)
    if flt.episodes_from_channel is not None:
        mask &= (kind != MemoryKind.EPISODIC.value) | (channel == key(flt.episodes_from_channel))
    if flt.episodes_not_from_session:
        mask &= (kind != MemoryKind.EPISODIC.value) | (
            cols["session_key"] != key(flt.episodes_not_from_session)
        )
    if flt.since_ms:
        mask &= cols["occurred_at_ms"] >= int(flt.since_ms)
    if flt.until_ms:
        mask &= cols["occurred_at_ms"] < int(flt.until_ms)
    return mask


def updated_since(ms: int) -> Expr:
    return col("updated_at_ms") >= lit(ms)


def not_superseded() -> Expr:
    return col("superseded_by") == lit("")


def recall_filter(who: Visibility, flt: MemoryFilter, now_ms: int) -> Expr:
    return narrowed(visible_to(who), flt, now_ms)


def written_by(user_id: str, agent_id: str) -> Expr:
    """One (user, agent)'s items: the unit of dedupe and caps."""
    return owned_by(user_id) & is_("agent_id", agent_id)


def user_wide() -> Expr:
    """Items every agent of the user reads (USER, and SHARED which reaches the same agents)."""
    return col("scope").isin([MemoryScope.USER.value, MemoryScope.SHARED.value])


def of_kind(kind: MemoryKind) -> Expr:
    return col("kind") == lit(MemoryKind(kind).value)


def with_id(memory_id: str) -> Expr:
    return is_("id", _require(memory_id, "memory_id"))


def occurred_on_days(days: list[int], day_ms: int) -> Expr:
    """Items that occurred on one of ``days`` (numbers of whole days since the epoch, UTC)."""
    expr: Expr | None = None
    for d in days:
        on = (col("occurred_at_ms") >= lit(int(d) * day_ms)) & (
            col("occurred_at_ms") < lit((int(d) + 1) * day_ms)
        )
        expr = on if expr is None else expr | on
    return expr if expr is not None else lit(False)


def with_ids(ids: list[str]) -> Expr:
    return among("id", list(ids))


def owned_ids(rows: Sequence[tuple[str, str]]) -> Expr:
    """The rows named by (user, id) pairs: each user's own rows of those ids, never another user's row
    of the same id (ownership is part of a row's identity, see ``store``)."""
    by_user: dict[str, list[str]] = {}
    for user_id, memory_id in rows:
        by_user.setdefault(user_id, []).append(memory_id)
    expr: Expr = lit(False)
    for user_id, ids in by_user.items():
        expr = expr | (owned_by(user_id) & with_ids(ids))
    return expr


def after_cursor(created_at_ms: int, memory_id: str) -> Expr:
    """Keyset pagination, newest first, on (created_at_ms, id_key): see ``page_order``."""
    return (col("created_at_ms") < lit(int(created_at_ms))) | (
        (col("created_at_ms") == lit(int(created_at_ms))) & (col("id_key") < lit(key(memory_id)))
    )


def page_order(created_at_ms: int, memory_id: str) -> tuple[int, str]:
    """The sort key matching ``after_cursor`` (ties broken by the id's digest, not the id)."""
    return created_at_ms, key(memory_id)
