"""Lifecycle events are written atomically with their state change and relayed exactly once
(sessions/events.py), through the real server and real Redis.

A sidecar killed between a state change and its XADD used to lose the event (chaos: 2 CLOSED/ARCHIVED
in ~800 sessions). The kill cannot be timed into that window from outside, so these tests check the
invariant itself: once the state-changing call has returned, the event reaches the stream exactly once
even if the process that made the change never relays it (its relay fails, or it is never run)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

import memlane
from memlane import Message, PromotionState, Role
from memlane_server.background import SidecarThread
from memlane_server.config import Settings
from memlane_server.infra.redis_pool import connect
from memlane_server.keyspace import KeySpace
from memlane_server.sessions.events import EventLog, EventType, pending
from memlane_server.sessions.model import SessionStatus
from memlane_server.sessions.store import SessionStore, now_ms
from memlane_server.tokens import TokenCounter
from memlane_server.wiring.stores import session_limits
from tests.conftest import ServerFactory, redis_client, stream_entries, wait_for

_ENDS = (EventType.CLOSED, EventType.PROMOTED, EventType.ARCHIVED)


@pytest.fixture(scope="module")
def srv(start_server: ServerFactory) -> SidecarThread:
    return start_server(ltm_enabled=False, lifecycle_sweep_interval_seconds=0.2)


@pytest.fixture()
def r(srv: SidecarThread) -> Any:
    c = redis_client(srv.settings.redis.redis_url)
    yield c
    c.close()


def _types(r: redis.Redis, keys: KeySpace, sid: str) -> list[int]:
    return [int(f[b"t"]) for f in stream_entries(r, keys.events()) if f[b"s"].decode() == sid]


def test_events_of_a_failed_emission_reach_the_stream_once(srv: SidecarThread, r: Any) -> None:
    """While the events stream cannot be written (a WRONGTYPE key stands in for a sidecar that dies
    right after the state change), CloseSession and the whole session-end pipeline still complete; once
    the stream is writable again the sweeper relays CLOSED, PROMOTED and ARCHIVED, each exactly once, in
    order. Before the outbox the state changed, the XADD failed, and the events were lost for good."""
    keys = KeySpace(srv.settings.redis.key_prefix)
    with memlane.Client(srv.target, timeout=20) as c:
        sid = c.create_session(user_id="u-outbox").session.session_id
        c.append_messages(
            session_id=sid,
            messages=[
                Message(role=Role.ROLE_USER, content="hello"),
                Message(role=Role.ROLE_ASSISTANT, content="hi"),
            ],
        )
        r.delete(keys.events())
        r.set(keys.events(), "not a stream")
        try:
            c.close_session(session_id=sid)
            wait_for(
                lambda: (
                    c.get_session(session_id=sid).session.promotion_state
                    == PromotionState.PROMOTION_STATE_ARCHIVED
                ),
                30,
            )
            assert r.llen(keys.outbox(sid)) == 3  # durable, waiting for the relay
        finally:
            r.delete(keys.events())
    wait_for(lambda: r.llen(keys.outbox(sid)) == 0, 30)
    assert _types(r, keys, sid) == [int(t) for t in _ENDS]
    wait_for(lambda: r.zscore(keys.outbox_due(), sid) is None, 30)  # the sweeper let go of it


async def _store(srv: SidecarThread) -> tuple[SessionStore, EventLog, Any]:
    client = connect(srv.settings.redis.redis_url)
    keys = KeySpace(srv.settings.redis.key_prefix)
    tokens = await asyncio.to_thread(TokenCounter, srv.settings.sessions.default_encoding)
    store = SessionStore(
        client, keys, tokens, limits=session_limits(Settings().sessions), default_ttl_seconds=0
    )
    return store, EventLog(client, keys, max_len=1000), client


def test_a_state_change_alone_leaves_its_event_for_the_sweeper(srv: SidecarThread, r: Any) -> None:
    """The storage operation alone (a writer that dies before relaying): the running sidecar's sweeper
    relays the event within the outbox grace period."""
    keys = KeySpace(srv.settings.redis.key_prefix)
    with memlane.Client(srv.target, timeout=20) as c:
        sid = c.create_session(user_id="u-outbox").session.session_id

    async def close_without_relay() -> None:
        store, _, client = await _store(srv)
        live = (SessionStatus.ACTIVE, SessionStatus.IDLE)
        event = pending(EventType.CLOSED, now_ms())
        await store.transition(sid, SessionStatus.CLOSED, live, "closed_at_ms", event=event, event_from=live)
        await client.aclose()

    asyncio.run(close_without_relay())
    assert r.llen(keys.outbox(sid)) == 1
    assert _types(r, keys, sid) == []
    # Polled: when the sweeper gets to it is the outbox grace and sweep interval (settings), not a figure
    # this test can measure on a loaded machine.
    wait_for(lambda: EventType.CLOSED in _types(r, keys, sid), 30)
    assert _types(r, keys, sid).count(int(EventType.CLOSED)) == 1


def test_relaying_twice_appends_once(srv: SidecarThread, r: Any) -> None:
    """A relayer that dies after the XADD but before removing the outbox entry: the entry is relayed
    again and the stream still holds the event once; an event not seen before is appended (control)."""
    keys = KeySpace(srv.settings.redis.key_prefix)
    with memlane.Client(srv.target, timeout=20) as c:
        sid = c.create_session(user_id="u-outbox").session.session_id

    async def run() -> None:
        store, events, client = await _store(srv)
        await store.transition(
            sid,
            SessionStatus.IDLE,
            (SessionStatus.ACTIVE,),
            "idle_at_ms",
            event=pending(EventType.IDLE, now_ms()),
            event_from=(SessionStatus.ACTIVE,),
        )
        entry = (await client.lrange(keys.outbox(sid), 0, -1))[0]
        assert await events.relay(sid) == 1
        await client.rpush(keys.outbox(sid), entry)  # as if the LREM never happened
        assert await events.relay(sid) == 1
        live = (SessionStatus.ACTIVE, SessionStatus.IDLE)
        await store.transition(
            sid,
            SessionStatus.CLOSED,
            live,
            "closed_at_ms",
            event=pending(EventType.CLOSED, now_ms()),
            event_from=live,
        )
        assert await events.relay(sid) == 1
        await client.aclose()

    asyncio.run(run())
    assert _types(r, keys, sid) == [int(EventType.IDLE), int(EventType.CLOSED)]
    assert r.llen(keys.outbox(sid)) == 0
