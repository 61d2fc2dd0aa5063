"""Opaque page tokens. A token is bound to the listing and filters that made it, so a token replayed
against another query is refused instead of silently skipping or repeating items."""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

import orjson

from ..errors import InvalidArgument
from ..page_bytes import MAX_PAGE_BYTES

__all__ = ["MAX_PAGE_BYTES"]  # re-exported for the session store's page loops

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
MESSAGE_OVERHEAD_BYTES = 64  # ids, numbers and framing of one item beyond its strings


def page_size(requested: int) -> int:
    if requested < 0:
        raise InvalidArgument("page_size must not be negative")
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def query_fingerprint(*parts: Any) -> str:
    return hashlib.blake2b(orjson.dumps(parts), digest_size=6).hexdigest()


def encode_token(query: str, cursor: list[Any]) -> str:
    raw = orjson.dumps({"q": query, "c": cursor})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, query: str) -> list[Any] | None:
    """The cursor inside ``token``; None for the first page. Raises InvalidArgument when malformed."""
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = orjson.loads(raw)
        cursor = data["c"]
        if not isinstance(cursor, list) or data["q"] != query:
            raise ValueError
    except (binascii.Error, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise InvalidArgument(
            "page_token is malformed or was issued for a different query; start again without it"
        ) from exc
    return cursor


def int_cursor(cursor: list[Any], length: int) -> list[int]:
    """A cursor of ``length`` integers. JSON booleans are not integers here (``True`` is an ``int`` to
    Python, and would reach Redis as the text "True")."""
    if len(cursor) != length or any(type(c) is not int for c in cursor):
        raise InvalidArgument("page_token is malformed; start again without it")
    return cursor
