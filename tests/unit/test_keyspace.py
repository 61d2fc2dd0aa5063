"""The Redis key layout (keyspace.py), checked without Redis: what the stores and the sweeper rely on."""

from __future__ import annotations

from memlane_server.keyspace import KeySpace


def _tag(key: str) -> str:
    """The hash tag Redis Cluster slots a key by: the text between the first ``{`` and the next ``}``."""
    start = key.index("{")
    return key[start + 1 : key.index("}", start)]


def test_every_key_of_a_session_shares_its_hash_tag() -> None:
    keys = KeySpace("t")
    every = keys.every_key_of("s1")
    assert len(every) == len(set(every))
    assert {_tag(k) for k in every} == {"s1"}  # one slot: one Lua script may touch them all


def test_erasure_reaches_the_checkpoints_and_the_pipeline_state() -> None:
    keys = KeySpace("t")
    every = set(keys.every_key_of("s1"))
    assert set(keys.checkpoints("s1").all()) <= every
    assert {keys.removals("s1"), keys.pipeline("s1"), keys.lease("s1"), keys.outbox("s1")} <= every


def test_the_alive_key_names_its_session() -> None:
    keys = KeySpace("t")
    assert keys.session_id_from_alive_key(keys.session("a:b").alive) == "a:b"
    assert keys.session_id_from_alive_key(keys.session("a").doc) is None
    assert keys.session_id_from_alive_key(KeySpace("other").session("a").alive) is None


def test_the_sessions_index_names_its_user() -> None:
    keys = KeySpace("t")
    assert keys.user_id_from_sessions_key(keys.user_sessions("u1")) == "u1"
    assert keys.user_id_from_sessions_key(keys.ltm_version("u1")) is None


def test_a_user_id_is_never_a_pattern() -> None:
    """ForgetUser scans ``user_pattern``: a user called ``*`` must not match every user's keys."""
    keys = KeySpace("t")
    assert keys.user_pattern("*") == "t:user:{\\*}:*"
    assert keys.session_pattern("a?[b]") == "t:{a\\?\\[b\\]}:*"


def test_per_user_keys_fall_under_the_users_pattern() -> None:
    """Erasure deletes what ``user_pattern`` matches: every per-user key must start with its prefix."""
    keys = KeySpace("t")
    head = keys.user_pattern("u1")[:-1]
    for key in (
        keys.user_sessions("u1"),
        keys.ltm_version("u1"),
        keys.ltm_removals("u1"),
        keys.memory_versions("u1"),
        keys.memory_snapshots("u1"),
        keys.memory_snapshot("u1", "snap"),
        keys.procedure_sources("u1"),
        keys.once("feedback", "u1", "op"),
    ):
        assert key.startswith(head), key
    assert keys.once("feedback", "u1", "op").startswith(keys.once_prefix("u1"))
    assert not keys.erasing("u1").startswith(head)  # outlives the erasure that deletes the user's keys


def test_the_queue_keys_share_the_queues_slot() -> None:
    """Parking moves a job between the queue and its parked stream in one MULTI: one slot."""
    keys = KeySpace("t")
    queue = keys.session_end_queue()
    for key in (keys.session_end_parked(), keys.session_end_failures(), keys.session_end_outbox()):
        assert _tag(key) == queue
    assert _tag(keys.relayed_events()) == keys.events()
