"""Listing pages through the real server (memlane_server/paging.py, ltm/service.py): a page token works
only for the query that issued it, any altered token is INVALID_ARGUMENT naming ``page_token``, and
ListMemories pages are keyset pages read inside LanceDB (each item once, in order, whatever is added
meanwhile, at a cost that does not grow with the user's rows).

The memories are written to the LanceDB directory before the sidecar opens it, with many items per
creation millisecond, so page boundaries fall inside runs of equal times (the id digest breaks ties).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import procedure_pb2 as ppb
from memlane_server.background import SidecarThread
from memlane_server.embedding import OnnxEmbedder, default_spec
from memlane_server.ltm import LanceMemoryStore, filters
from memlane_server.ltm.model import MemoryFilter, MemoryItem, Visibility
from memlane_server.ltm.service import page_query
from memlane_server.memory_kinds import MemoryKind, MemoryScope
from memlane_server.paging import MAX_PAGE_BYTES, encode_token
from tests.conftest import ServerFactory

PAGER = "pager-user"  # 1,000 memories, 20 per creation millisecond
SMALL = "small-user"  # 20 memories
BIG = "big-user"  # 4,000 memories of about 8 KiB each
OTHER = "other-user"  # 20 memories, to replay PAGER's tokens against
BASE_MS = 1_700_000_000_000
HEAVY = {f"k{i}": "v" * 1000 for i in range(8)}


def _items(
    user: str, n: int, vectors: list[list[float]], *, per_ms: int, heavy: bool = False
) -> list[MemoryItem]:
    return [
        MemoryItem(
            id=f"{user}-{i:04d}",
            user_id=user,
            agent_id="",
            scope=MemoryScope.USER,
            kind=MemoryKind.FACT,
            content=f"Fact {i} of {user}: locker {i} holds item {i * 7}.",
            created_at_ms=BASE_MS + i // per_ms,
            updated_at_ms=BASE_MS + i // per_ms,
            occurred_at_ms=BASE_MS + i // per_ms,
            metadata=HEAVY if heavy else {},
            vector=vectors[i % len(vectors)],
        )
        for i in range(n)
    ]


async def _seed(uri: str) -> None:
    embedder = OnnxEmbedder.load(default_spec())
    try:
        # Listing reads no vector: a few real ones, shared by the rows, keep the seeding quick.
        texts = [f"Fact {i}: locker {i} holds item {i * 7}." for i in range(16)]
        vectors = [v.tolist() for v in await embedder.embed(texts)]
        store = await LanceMemoryStore.open(uri, embedder.ndims)
        try:
            await store.add(_items(PAGER, 1000, vectors, per_ms=20))
            await store.add(_items(SMALL, 20, vectors, per_ms=1, heavy=True))
            await store.add(_items(OTHER, 20, vectors, per_ms=1))
            for start in range(0, 4000, 1000):
                chunk = _items(BIG, 4000, vectors, per_ms=3, heavy=True)[start : start + 1000]
                await store.add(chunk)
        finally:
            store.close()
    finally:
        await embedder.close()


@pytest.fixture(scope="module")
def srv(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> SidecarThread:
    uri = str(tmp_path_factory.mktemp("paging-ltm") / "ltm")
    asyncio.run(_seed(uri))
    return start_server(ltm_uri=uri, ltm_snapshots_max_per_user=5)


@pytest.fixture(scope="module")
def c(srv: SidecarThread) -> Iterator[memlane.Client]:
    with memlane.Client(srv.target, timeout=60) as client:
        yield client


def _memories(
    c: memlane.Client, user: str, size: int, token: str = "", **flt: Any
) -> mpb.ListMemoriesResponse:
    return c.list_memories(
        caller=mpb.Caller(user_id=user), filter=mpb.MemoryFilter(**flt), page_size=size, page_token=token
    )


def _order(memory_id: str, created_ms: int) -> tuple[int, str]:
    return created_ms, hashlib.sha256(memory_id.encode()).hexdigest()


def _refused(call: Callable[[], object], match: str = "page_token") -> memlane.InvalidArgumentError:
    with pytest.raises(memlane.InvalidArgumentError, match=match) as info:
        call()
    assert info.value.field == "page_token" and info.value.reason == "INVALID_PAGE_TOKEN"
    return info.value


@pytest.fixture(scope="module")
def tokens(c: memlane.Client) -> dict[str, str]:
    """A real next-page token of each listing, with the call that continues it."""
    sid = c.create_session(user_id=PAGER).session.session_id
    c.append_messages(
        session_id=sid, messages=[Message(role=Role.ROLE_USER, content=f"m{i}") for i in range(3)]
    )
    for i in range(2):
        list(c.assemble_context(session_id=sid, user_input=f"question {i}"))
    c.create_session(user_id=PAGER)
    out = {
        "sessions": c.list_sessions(user_id=PAGER, page_size=1).next_page_token,
        "messages": c.list_messages(session_id=sid, page_size=1).next_page_token,
        "traces": c.list_turn_traces(session_id=sid, page_size=1).next_page_token,
        "memories": _memories(c, PAGER, 3).next_page_token,
        "sid": sid,
    }
    assert all(out.values())
    return out


def _listings(c: memlane.Client, sid: str) -> dict[str, Callable[[str], object]]:
    return {
        "sessions": lambda t: c.list_sessions(user_id=PAGER, page_size=1, page_token=t),
        "messages": lambda t: c.list_messages(session_id=sid, page_size=1, page_token=t),
        "traces": lambda t: c.list_turn_traces(session_id=sid, page_size=1, page_token=t),
        "memories": lambda t: _memories(c, PAGER, 3, t),
    }


def test_a_token_is_refused_by_every_other_query(c: memlane.Client, tokens: dict[str, str]) -> None:
    listings = _listings(c, tokens["sid"])
    for name, call in listings.items():
        call(tokens[name])  # control: each token continues its own listing
        for other, token in tokens.items():
            if other not in (name, "sid"):
                _refused(functools.partial(call, token), "different query")
    memories = tokens["memories"]
    # Another user, another agent, another filter: other queries (the page size is not part of one).
    _refused(lambda: _memories(c, OTHER, 3, memories), "different query")
    _refused(lambda: c.list_memories(caller=mpb.Caller(user_id=PAGER, agent_id="a1"), page_token=memories))
    _refused(lambda: _memories(c, PAGER, 3, memories, kinds=[mpb.MEMORY_KIND_FACT]), "different query")
    _refused(lambda: _memories(c, PAGER, 3, memories, include_retired=True), "different query")
    _refused(lambda: c.list_sessions(user_id=OTHER, page_token=tokens["sessions"]), "different query")
    other_sid = c.create_session(user_id=PAGER).session.session_id
    _refused(lambda: c.list_turn_traces(session_id=other_sid, page_token=tokens["traces"]), "different query")
    _refused(lambda: c.list_messages(session_id=other_sid, page_token=tokens["messages"]), "different query")
    assert len(_memories(c, PAGER, 7, memories).memories) == 7  # the page size is not part of the query


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


@st.composite
def _altered(draw: st.DrawFn, token: str) -> str:
    """``token`` truncated, extended, with one character changed, dropped or doubled, padded, re-cased,
    or replaced by anything at all."""
    i = draw(st.integers(min_value=0, max_value=len(token) - 1))
    kind = draw(st.sampled_from(["cut", "flip", "drop", "dup", "add", "pad", "case", "space", "any"]))
    if kind == "cut":
        return token[:i]
    if kind == "flip":
        return token[:i] + draw(st.sampled_from(_B64.replace(token[i], ""))) + token[i + 1 :]
    if kind == "drop":
        return token[:i] + token[i + 1 :]
    if kind == "dup":
        return token[: i + 1] + token[i:]
    if kind == "add":
        return token + draw(st.text(min_size=1, max_size=8))
    if kind == "pad":
        return token + "=" * draw(st.integers(min_value=1, max_value=3))
    if kind == "case":
        return token.swapcase()
    if kind == "space":
        return token[:i] + draw(st.sampled_from([" ", "\n", "\x00", "+", "/", "."])) + token[i:]
    return draw(st.text(max_size=2000))


@pytest.mark.parametrize("name", ["sessions", "messages", "traces", "memories"])
def test_altered_tokens_are_invalid_argument(c: memlane.Client, tokens: dict[str, str], name: str) -> None:
    call = _listings(c, tokens["sid"])[name]

    @settings(max_examples=60, deadline=None, derandomize=True, database=None)
    @given(bad=_altered(tokens[name]))
    def run(bad: str) -> None:
        if bad in ("", tokens[name]):
            return  # the first page, or the token itself: both are fine
        _refused(lambda: call(bad))

    run()


_INTS = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what JSON (orjson) encodes as an integer
_JSON = st.recursive(
    st.none() | st.booleans() | _INTS | st.floats(allow_nan=False) | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(cursor=st.one_of(st.lists(_JSON, max_size=4), st.tuples(_INTS, st.text(max_size=300)).map(list)))
def test_forged_memory_cursors_are_refused_or_honoured(c: memlane.Client, cursor: list[Any]) -> None:
    """A token with the right format and query but a cursor the server never issued: refused unless it
    is a well-typed (created ms, memory id), which then only chooses where the caller's own listing
    starts."""
    token = encode_token(page_query(Visibility(PAGER), MemoryFilter(include_retired=False)), cursor)
    try:
        page = _memories(c, PAGER, 5, token)
    except memlane.InvalidArgumentError as exc:
        assert exc.field == "page_token"
        return
    created, last = cursor
    assert type(created) is int and 0 <= created < 2**63 and isinstance(last, str) and 0 < len(last) <= 256
    assert all(m.user_id == PAGER for m in page.memories)
    assert all(_order(m.memory_id, m.created_at_unix_ms) < _order(last, created) for m in page.memories)


def test_paging_through_1000_memories_returns_each_once_in_order(c: memlane.Client) -> None:
    seen: list[mpb.Memory] = []
    token, pages = "", 0
    while True:
        page = _memories(c, PAGER, 37, token)
        assert len(page.memories) <= 37 and page.ByteSize() <= MAX_PAGE_BYTES
        assert page.total_size == 1000
        seen.extend(page.memories)
        pages, token = pages + 1, page.next_page_token
        if not token:
            break
    ids = [m.memory_id for m in seen]
    assert len(ids) == len(set(ids)) == 1000 and pages == 28
    keys = [_order(m.memory_id, m.created_at_unix_ms) for m in seen]
    assert keys == sorted(keys, reverse=True)  # newest first, ties by the id's digest


def test_a_memory_created_while_paging_duplicates_nothing(c: memlane.Client, user_id: str) -> None:
    who = mpb.Caller(user_id=user_id)
    made = [
        c.create_memory(
            caller=who, kind=mpb.MEMORY_KIND_FACT, content=f"The user owns {n} red kayaks."
        ).memory.memory_id
        for n in range(6)
    ]
    first = _memories(c, user_id, 2)
    late = c.create_memory(caller=who, kind=mpb.MEMORY_KIND_FACT, content="The user sails on Tuesdays.")
    seen = [m.memory_id for m in first.memories]
    token = first.next_page_token
    while token:
        page = _memories(c, user_id, 2, token)
        seen.extend(m.memory_id for m in page.memories)
        token = page.next_page_token
    assert sorted(seen) == sorted(made)  # each once; the newer item is not in the older pages
    assert _memories(c, user_id, 1).memories[0].memory_id == late.memory.memory_id


def test_history_and_procedure_tokens_are_bound_too(c: memlane.Client, tokens: dict[str, str]) -> None:
    who = mpb.Caller(user_id=OTHER)
    for i in range(3):
        c.create_memory_snapshot(caller=who, snapshot_id=f"snap-{i}")
        c.create_memory(caller=who, kind=mpb.MEMORY_KIND_FACT, content=f"The user climbed peak number {i}.")
        c.propose_procedure(
            procedure_id=f"proc-{i}",
            kind=ppb.PROCEDURE_KIND_ROUTINE,
            content=f"Step {i}: check the order id.",
            title="p",
        )
    listings: dict[str, Callable[[str], Any]] = {
        "snapshots": lambda t: c.list_memory_snapshots(caller=who, page_size=1, page_token=t),
        "versions": lambda t: c.list_memory_versions(caller=who, page_size=1, page_token=t),
        "procedures": lambda t: c.list_procedures(page_size=1, page_token=t),
    }
    mine = {name: call("").next_page_token for name, call in listings.items()}
    for name, call in listings.items():
        items = list(memlane.iter_pages(call, name))
        assert len(items) == len({str(i) for i in items}) >= 3  # each once
        for token in [*mine.values(), tokens["memories"], tokens["sessions"]]:
            if token != mine[name]:
                _refused(functools.partial(call, token), "different query")
    _refused(lambda: c.list_memory_snapshots(caller=mpb.Caller(user_id=PAGER), page_token=mine["snapshots"]))
    _refused(lambda: c.list_memory_versions(caller=mpb.Caller(user_id=PAGER), page_token=mine["versions"]))
    agent = mpb.Caller(user_id=OTHER, agent_id="a1")
    _refused(lambda: c.list_memory_versions(caller=agent, page_token=mine["versions"]))


def test_page_size_is_one_rule(c: memlane.Client, tokens: dict[str, str]) -> None:
    assert len(_memories(c, PAGER, 0).memories) == 50  # 0 means the default
    assert len(_memories(c, PAGER, 10_000).memories) == 500  # above the maximum: the maximum
    assert len(c.list_turn_traces(session_id=tokens["sid"], page_size=10_000).traces) == 2
    for call in (
        lambda: _memories(c, PAGER, -1),
        lambda: c.list_sessions(user_id=PAGER, page_size=-1),
        lambda: c.list_turn_traces(session_id=tokens["sid"], page_size=-1),
    ):
        with pytest.raises(memlane.InvalidArgumentError, match="page_size") as info:
            call()
        assert info.value.field == "page_size"


def _first_page_seconds(c: memlane.Client, user: str, token: str = "") -> float:
    """The median time of a page of 10 (from ``token``)."""
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        assert len(_memories(c, user, 10, token).memories) == 10
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def test_a_page_costs_its_own_rows_not_the_users(c: memlane.Client) -> None:
    """BIG holds 200 times SMALL's rows (about 32 MiB of them). Reading them all for a page of 10, as
    ListMemories did, took 0.83 s here against 0.011 s for SMALL; a keyset page reads three short
    columns of BIG's rows inside LanceDB and then 10 rows (0.017-0.028 s against 0.016-0.019 s)."""
    _first_page_seconds(c, BIG), _first_page_seconds(c, SMALL)  # warm both (index and file caches)
    small, big = _first_page_seconds(c, SMALL), _first_page_seconds(c, BIG)
    assert big < 3 * small + 0.1, (small, big)
    # A page deep in the listing (past the keyset cursor) is as cheap.
    deep = _memories(c, BIG, 500, _memories(c, BIG, 500).next_page_token).next_page_token
    assert _first_page_seconds(c, BIG, deep) < 3 * small + 0.1


def test_pages_after_an_erasure_rewrote_the_table(tmp_path: Path) -> None:
    """An erasure rewrites the other rows of every fragment that held the user's rows and rebuilds the
    indexes; LanceDB then needs the row id to plan a page's sorted read (it failed with INTERNAL)."""

    async def run() -> list[tuple[int, str]]:
        store = await LanceMemoryStore.open(str(tmp_path / "ltm"), 4)
        try:
            vector = [0.5, 0.5, 0.5, 0.5]
            await store.add(_items("keep", 5, [vector], per_ms=1) + _items("gone", 4, [vector], per_ms=1))
            await store.erase(filters.owned_by("gone"))
            return await store.newest_keys(filters.owned_by("keep"), 3)
        finally:
            store.close()

    assert asyncio.run(run()) == [(BASE_MS + i, f"keep-{i:04d}") for i in (4, 3, 2)]
