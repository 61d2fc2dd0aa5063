"""Opaque page tokens. A token is bound to the listing and filters that made it, so a token replayed
against another query is refused instead of silently skipping or repeating items."""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

import orjson

from ..errors import InvalidArgument

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000


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
