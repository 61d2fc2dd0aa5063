"""The child processes of ``memlane serve`` (children.py), the parts that need no child: how long a child
that keeps dying waits before each restart, and the settings a worker process is handed."""

from __future__ import annotations

import orjson

from memlane_server.children import worker_settings
from memlane_server.config import build_settings, setting_fields
from memlane_server.supervision import RESTART_BACKOFF_S, backoff


def test_restarts_back_off_then_hold_at_the_last_wait() -> None:
    waits = [backoff(n) for n in range(len(RESTART_BACKOFF_S) + 3)]
    assert waits[: len(RESTART_BACKOFF_S)] == list(RESTART_BACKOFF_S)
    assert waits == sorted(waits)  # never shorter after another failure
    assert set(waits[len(RESTART_BACKOFF_S) - 1 :]) == {RESTART_BACKOFF_S[-1]}


def test_a_worker_gets_every_setting_with_this_process_redis_and_no_listener() -> None:
    settings = build_settings({"worker_processes": 2, "pipeline_enabled": False}, env={})
    handed = orjson.loads(worker_settings(settings, "unix:///tmp/r.sock", "127.0.0.1:9999"))
    assert set(handed) == set(setting_fields())
    assert handed["redis_url"] == "unix:///tmp/r.sock"
    assert handed["listen"] == ""  # no gRPC port in a worker
    assert handed["admin_listen"] == "127.0.0.1:9999"
    assert handed["worker_processes"] == 0  # a worker starts no workers of its own
    assert handed["pipeline_enabled"] is True  # running the jobs is what it is for
