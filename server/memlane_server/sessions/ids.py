"""Ids: generation is shared with the client (``memlane.new_id``); the grammar of client-chosen ids
lives in ``memlane_server.ids`` (one grammar for every RPC), re-exported here for the session code."""

from __future__ import annotations

from memlane import new_id

from ..ids import check_id, is_valid_id

__all__ = ["check_id", "is_valid_id", "new_id"]
