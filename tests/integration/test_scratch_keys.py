"""``drop_keys``: what eval and bench run at the end on a user's Redis. It removes every key of its prefix
(session keys with hash tags, user indexes, streams) and nothing of a neighbouring prefix."""

from __future__ import annotations

import uuid

import redis

from memlane_server.keyspace import KeySpace, drop_keys


def test_drop_keys_removes_one_prefix_only(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    mine = f"scratch{uuid.uuid4().hex[:8]}"
    neighbour = f"{mine}x"  # shares the first characters: a sloppy pattern would take it too
    try:
        for prefix in (mine, neighbour):
            ks = KeySpace(prefix)
            for i in range(1200):  # more than one SCAN page and one delete batch
                r.set(ks.session(f"s{i}").doc, "x")
            r.zadd(ks.user_sessions("u1"), {"s1": 1})
            r.xadd(ks.events(), {"s": "s1"})
        assert drop_keys(redis_url, mine) == 1202
        assert list(r.scan_iter(match=KeySpace(mine).pattern())) == []
        assert len(list(r.scan_iter(match=KeySpace(neighbour).pattern(), count=1000))) == 1202
    finally:
        drop_keys(redis_url, neighbour)
        r.close()
