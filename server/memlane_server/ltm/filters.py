"""LanceDB filter expressions for memory reads.

Built with ``lancedb.expr`` (typed column/literal nodes) rather than string formatting, so a user id
like ``o'brien') OR (1=1`` stays a literal. Every read filter starts from ``visible_to``, which always
pins ``user_id``: that is the one rule that keeps users apart.
"""

from __future__ import annotations

from lancedb.expr import Expr, col, lit

from memlane_server.errors import InvalidArgument
from memlane_server.ltm.model import MemoryFilter, MemoryKind, MemoryScope, Visibility


def _require(value: str, name: str) -> str:
    if not value:
        raise InvalidArgument(f"{name} is required")
    if "\x00" in value:
        raise InvalidArgument(f"{name} must not contain NUL")
    return value


def active(now_ms: int) -> Expr:
    """Not superseded and not past its validity: the only items recall and profile may serve."""
    return (col("superseded_by") == lit("")) & (
        (col("valid_until_ms") == lit(0)) | (col("valid_until_ms") > lit(now_ms))
    )


def owned_by(user_id: str) -> Expr:
    return col("user_id") == lit(_require(user_id, "user_id"))


def visible_to(who: Visibility) -> Expr:
    """The user's items that this agent may read (see ``MemoryScope``)."""
    # An agent's private items, including those of the unnamed agent ("") of a single-agent app that
    # never sets agent ids: its sessions promote episodes as agent-private to "".
    shared = col("scope").isin([MemoryScope.USER.value, MemoryScope.SHARED.value]) | (
        (col("scope") == lit(MemoryScope.AGENT.value)) & (col("agent_id") == lit(who.agent_id))
    )
    groups = [g for g in who.groups if g]
    if groups:
        shared = shared | ((col("scope") == lit(MemoryScope.GROUP.value)) & col("group").isin(groups))
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
        expr = expr & (col("channel") == lit(flt.channel))
    if flt.episodes_from_channel is not None:
        # Durable facts follow the user everywhere; raw conversation (episodes) stays in its channel.
        expr = expr & (
            (col("kind") != lit(MemoryKind.EPISODIC.value))
            | (col("channel") == lit(flt.episodes_from_channel))
        )
    if flt.since_ms:
        expr = expr & (col("occurred_at_ms") >= lit(flt.since_ms))
    if flt.until_ms:
        expr = expr & (col("occurred_at_ms") < lit(flt.until_ms))
    return expr


def recall_filter(who: Visibility, flt: MemoryFilter, now_ms: int) -> Expr:
    return narrowed(visible_to(who), flt, now_ms)


def with_id(memory_id: str) -> Expr:
    return col("id") == lit(_require(memory_id, "memory_id"))


def with_ids(ids: list[str]) -> Expr:
    return col("id").isin(list(ids))
