"""Redis command families: a fixed table, so a label never carries an argument or an unknown name."""

from __future__ import annotations

from memlane_server.infra.redis_pool import FAMILIES, family_of


def test_known_commands_map_to_their_family() -> None:
    assert family_of("HGET") == "hash" and family_of(b"EVALSHA") == "script" and family_of("zadd") == "zset"
    assert family_of("SCRIPT LOAD") == "script" and family_of("XREADGROUP") == "stream"


def test_waiting_for_data_is_its_own_family() -> None:
    assert family_of("XREAD", "COUNT", 256, "BLOCK", 1000, "STREAMS", "k", "0") == "blocking"
    assert family_of("XREAD", "COUNT", 256, "STREAMS", "k", "0") == "stream"  # control: no BLOCK
    assert family_of("BLPOP", "k", 0) == "blocking"


def test_anything_else_is_other() -> None:
    for name in ("NOSUCH", "<script>", "", "HGET\\nDEL", b"\xff\xfe"):
        assert family_of(name) == "other", name
    assert {
        family_of(c) for c in ("GET", "HSET", "RPUSH", "SADD", "ZADD", "XADD", "DEL", "EVAL", "PING")
    } < set(FAMILIES)
