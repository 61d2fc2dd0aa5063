"""Listing pages, the one way: a page-size rule, an opaque page token, and a byte bound per page.

Every listing (sessions, messages, turn traces, memories, checkpoints, parked jobs) uses these.

**Page size.** Negative is INVALID_ARGUMENT; 0 means the listing's default; above the listing's maximum
it is lowered to that maximum (the protos say "At most N; 0 means D"; a client asking for more simply
gets full pages, as in Google's AIP-158).

**Page token.** ``base64url(version | query digest | check | cursor JSON)``, no padding, canonical form
only. The *query digest* names the listing and every parameter that shapes it (the user, the caller,
each filter): a token handed to another query (another user, another listing, another filter) is
refused with INVALID_ARGUMENT instead of silently skipping or repeating items. The *check* is a digest
over the version, the whole query fingerprint and the cursor: a truncated, altered or corrupted token
is refused too. The check has no secret key, on purpose: a token must survive a sidecar restart and a
reconnection to another sidecar, and it grants nothing; every page applies the caller's own access
filter again, so a client that forges a cursor for its own query only chooses where its own listing
starts. What the cursor holds is still hostile: each listing checks its shape and types
(``cursor_of``) before using it, and no part of it ever reaches a query as text.

**Byte bound.** A page stops before it passes ``MAX_PAGE_BYTES`` (it always holds at least one item),
well under the 16 MiB a client receives by default, whatever the items weigh; its page token then
continues after the last item it holds.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable
from typing import Any

import orjson

from . import linear_regex
from .errors import InvalidArgument

MAX_PAGE_BYTES = 4 * 1024 * 1024
MESSAGE_OVERHEAD_BYTES = 64  # ids, numbers and framing of one item beyond its strings
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000

TOKEN_VERSION = 1
# A real token is well under this (a cursor is a few numbers and one id); longer is refused unread.
MAX_TOKEN_CHARS = 1024
_QUERY_BYTES = 8  # of the query's digest, in the token: enough to tell queries apart
_CHECK_BYTES = 12
_HEADER = 1 + _QUERY_BYTES + _CHECK_BYTES
_BASE64URL = linear_regex.compile_run(r"[A-Za-z0-9_-]+")
_MAX_CURSOR_INT = 2**63 - 1  # every number a cursor holds is a time, a score or a sequence number
_MAX_CURSOR_CHARS = 256  # an id (at most 128 characters) with room to spare

_MALFORMED = "page_token is malformed or was altered; start again without it"
_FOREIGN = (
    "page_token was issued for a different query (another listing, user or filter); start again without it"
)
_OLD = "page_token was issued by another version of the server; start again without it"


def _invalid(message: str) -> InvalidArgument:
    return InvalidArgument(message, field="page_token", reason="INVALID_PAGE_TOKEN")


def malformed_token() -> InvalidArgument:
    """The error for a cursor a listing's own checks refuse (beyond ``cursor_of``)."""
    return _invalid(_MALFORMED)


def stale_token(what: str) -> InvalidArgument:
    """The error for a well-formed cursor naming an item that is gone (``what`` says which)."""
    return _invalid(f"page_token names {what} that no longer exists; start again without it")


def page_size(requested: int, *, default: int = DEFAULT_PAGE_SIZE, maximum: int = MAX_PAGE_SIZE) -> int:
    """The rule of every listing: negative refused, 0 -> ``default``, above ``maximum`` -> ``maximum``."""
    if requested < 0:
        raise InvalidArgument("page_size must not be negative", field="page_size", reason="INVALID_PAGE_SIZE")
    return min(requested or default, maximum)


def query_fingerprint(*parts: Any) -> str:
    """Names one query: the listing's name first, then every parameter that shapes its results (lists
    sorted by the caller when their order does not matter). JSON-encodable parts only."""
    return hashlib.blake2b(orjson.dumps(parts), digest_size=16, person=b"memlane-query").hexdigest()


def _query_digest(query: str) -> bytes:
    """Any text names a query (a listing with no parameters may use a constant such as "parked-jobs")."""
    return hashlib.blake2b(query.encode(), digest_size=16, person=b"memlane-page-q").digest()


def _check(query: bytes, cursor: bytes) -> bytes:
    return hashlib.blake2b(
        bytes([TOKEN_VERSION]) + query + cursor, digest_size=_CHECK_BYTES, person=b"memlane-page"
    ).digest()


def encode_token(query: str, cursor: list[Any]) -> str:
    """The token that resumes ``query`` after ``cursor`` (a list of ints and strings)."""
    q = _query_digest(query)
    raw = orjson.dumps(cursor)
    data = bytes([TOKEN_VERSION]) + q[:_QUERY_BYTES] + _check(q, raw) + raw
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _token_bytes(token: str) -> bytes:
    if len(token) > MAX_TOKEN_CHARS or not _BASE64URL.fullmatch(token):
        raise _invalid(_MALFORMED)
    try:
        data = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except ValueError as exc:  # binascii.Error is a ValueError: a length no encoding produces
        raise _invalid(_MALFORMED) from exc
    # Only the canonical spelling: two strings decoding to the same bytes would be two tokens.
    if base64.urlsafe_b64encode(data).decode().rstrip("=") != token:
        raise _invalid(_MALFORMED)
    return data


def decode_token(token: str, query: str) -> list[Any] | None:
    """The cursor inside ``token``; None for the first page (empty token). Raises InvalidArgument naming
    ``page_token`` when the token is malformed, altered, from another version or for another query.
    The cursor's items are then the listing's to check (``cursor_of``, ``int_cursor``)."""
    if not token:
        return None
    data = _token_bytes(token)
    if len(data) <= _HEADER:
        raise _invalid(_MALFORMED)
    if data[0] != TOKEN_VERSION:
        raise _invalid(_OLD)
    q = _query_digest(query)
    if not hmac.compare_digest(data[1 : 1 + _QUERY_BYTES], q[:_QUERY_BYTES]):
        raise _invalid(_FOREIGN)
    raw = data[_HEADER:]
    if not hmac.compare_digest(data[1 + _QUERY_BYTES : _HEADER], _check(q, raw)):
        raise _invalid(_MALFORMED)
    try:
        cursor = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _invalid(_MALFORMED) from exc
    if not isinstance(cursor, list):
        raise _invalid(_MALFORMED)
    return cursor


def cursor_of(cursor: list[Any], *types: type[int] | type[str]) -> list[Any]:
    """``cursor`` if it holds exactly one item of each of ``types`` in order: ints in 0..2**63-1 (JSON
    booleans are not ints here, though ``True`` is an ``int`` to Python, and would reach Redis as the
    text "True"), strings non-empty and at most 256 characters."""
    if len(cursor) != len(types):
        raise _invalid(_MALFORMED)
    for value, kind in zip(cursor, types, strict=True):
        if type(value) is not kind:
            raise _invalid(_MALFORMED)
        if isinstance(value, int) and not 0 <= value <= _MAX_CURSOR_INT:
            raise _invalid(_MALFORMED)
        if isinstance(value, str) and not 0 < len(value) <= _MAX_CURSOR_CHARS:
            raise _invalid(_MALFORMED)
    return cursor


def int_cursor(cursor: list[Any], length: int) -> list[int]:
    """A cursor of ``length`` integers (see ``cursor_of``)."""
    return cursor_of(cursor, *([int] * length))


def fitting(costs: Iterable[int], limit: int = MAX_PAGE_BYTES) -> int:
    """How many leading items, of the given byte costs, one page holds (at least one, if any)."""
    taken = total = 0
    for cost in costs:
        if taken and total + cost > limit:
            break
        taken, total = taken + 1, total + cost
    return taken
