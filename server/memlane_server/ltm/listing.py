"""ListMemories' pages: newest first by (created_at_ms, id digest), keyset-paginated inside LanceDB.

A page reads ``size + 1`` keys in that order past the cursor (LanceDB keeps the top ones while it scans
the user's rows, reading three short columns), then fetches those items whole: its cost is its own
rows, whatever the user holds. Items added while a client pages are newer than its cursor and never
shift or repeat a later page; deleted ones simply no longer appear.

The page token (``memlane_server.paging``) is bound to the reader (user, agent, groups) and to every
filter field; its cursor, (created ms, memory id), is checked by type and range and reaches LanceDB
only through ``filters.after_cursor`` (an integer and the id's digest, never the id's text).
"""

from __future__ import annotations

from lancedb.expr import Expr

from ..memory_kinds import MemoryKind, MemoryScope
from ..paging import cursor_of, decode_token, encode_token, fitting, page_size, query_fingerprint
from . import filters
from .model import MemoryFilter, MemoryItem, MemoryPage, Visibility
from .store import LanceMemoryStore

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


def page_query(who: Visibility, flt: MemoryFilter) -> str:
    """What a ListMemories token is bound to: the reader and every filter field."""
    return query_fingerprint(
        "memories",
        who.user_id,
        who.agent_id,
        sorted(set(who.groups)),
        sorted({MemoryKind(k).value for k in flt.kinds}),
        sorted({MemoryScope(s).value for s in flt.scopes}),
        flt.channel,
        flt.episodes_from_channel,
        flt.since_ms,
        flt.until_ms,
        flt.include_retired,
    )


async def list_page(
    store: LanceMemoryStore, who: Visibility, flt: MemoryFilter, where: Expr, *, size: int, token: str
) -> MemoryPage:
    """One page of the items ``where`` matches (the reader's visibility and ``flt``, already built)."""
    size = page_size(size, default=DEFAULT_PAGE_SIZE, maximum=MAX_PAGE_SIZE)
    query = page_query(who, flt)
    cursor = decode_token(token, query)
    total = await store.count(where)
    if cursor is not None:
        created, last_id = cursor_of(cursor, int, str)
        where = where & filters.after_cursor(created, last_id)
    keys = await store.newest_keys(where, size + 1)
    more = len(keys) > size
    keys = keys[:size]
    found = await store.fetch(where & filters.with_ids([i for _, i in keys])) if keys else []
    # Back in page order; an item deleted between the two reads is simply absent.
    by_id = {i.id: i for i in found}
    items = [by_id[i] for _, i in keys if i in by_id]
    page = items[: fitting(_item_bytes(i) for i in items)]
    if len(page) < len(items):  # the byte bound ended the page: go on after its last item
        return MemoryPage(page, encode_token(query, [page[-1].created_at_ms, page[-1].id]), total)
    return MemoryPage(page, encode_token(query, list(keys[-1])) if more else "", total)


def _item_bytes(item: MemoryItem) -> int:
    """About what one item weighs on the wire: its strings plus a fixed allowance for ids and numbers."""
    strings = [item.content, *item.keywords, *item.metadata.keys(), *item.metadata.values()]
    return 256 + sum(len(s.encode()) for s in strings)
