"""Ids: generation is shared with the client (``memlane.new_id``); validation of client-chosen ids."""

from __future__ import annotations

import re

from memlane import new_id

__all__ = ["is_valid_id", "new_id"]

# Ids a client may choose: generous enough for "D3:7", "<session>-<agent>-<seq>", UUIDs and ULIDs,
# narrow enough to be safe inside Redis keys, LanceDB filters and file names.
_CLIENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


def is_valid_id(value: str) -> bool:
    return _CLIENT_ID.fullmatch(value) is not None
