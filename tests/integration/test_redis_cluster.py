"""memlane on a real Redis Cluster (3 masters + 3 replicas on loopback, started by scripts/redis-cluster):
expiry events from every master, replica acknowledgement (redis_wait_replicas), and a master killed with
SIGKILL while a client appends: its replica is promoted, no acknowledged message is lost, and expiry events
from the promoted node reach the sidecar.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import memlane
from memlane import Message, Role, SessionStatus
from memlane_server.keyspace import KeySpace
from tests.conftest import ServerFactory, redis_client, wait_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "redis-cluster"


class Cluster:
    def __init__(self, directory: Path, base_port: int) -> None:
        self.dir = directory
        out = subprocess.run(
            [str(SCRIPT), "start", str(directory), str(base_port)],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.url = out.stdout.strip().splitlines()[-1]
        self.client = redis_client(self.url)

    def stop(self) -> None:
        self.client.close()
        subprocess.run([str(SCRIPT), "stop", str(self.dir)], check=False, timeout=60)

    def master_of(self, key: str) -> str:
        """The master serving ``key``'s slot now (asked of the cluster, not a client's cached map)."""
        c: Any = self.client
        slot = int(c.keyslot(key))
        for name, info in self.nodes().items():
            serving = any(int(r[0]) <= slot <= int(r[-1]) for r in info["slots"])
            if serving and "master" in info["flags"] and "fail" not in info["flags"]:
                return name
        raise AssertionError(f"no master serves slot {slot}")

    def nodes(self) -> dict[str, dict[str, Any]]:
        c: Any = self.client
        return dict(c.cluster_nodes())

    def replica_of(self, master: str) -> str:
        """The master's replica, as the node asked sees it: gossip may not have told every node yet."""

        def find() -> str | None:
            nodes = self.nodes()
            master_id = nodes[master]["node_id"]
            replicas = (n for n, i in nodes.items() if i["master_id"] == master_id and "slave" in i["flags"])
            return next(replicas, None)

        return str(wait_for(find, timeout=30))

    def restart(self, node: str) -> None:
        port = node.rsplit(":", 1)[1]
        subprocess.run([str(SCRIPT), "restart-node", str(self.dir), port], check=True, timeout=60)

    def pid(self, node: str) -> int:
        return int((self.dir / node.rsplit(":", 1)[1] / "redis.pid").read_text())


def _free_base_port() -> int:
    """A base port whose six node ports and their cluster-bus ports (+10000) are free: fixed ports
    collide with another run of this module on the same machine."""
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(20000, 30000, 10)
        try:
            for port in [base + i + bus for i in range(1, 7) for bus in (0, 10000)]:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free ports for a cluster")


def _start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("cluster"), _free_base_port())
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from _start(tmp_path_factory)


def _doc(prefix: str, sid: str) -> str:
    return KeySpace(prefix).session(sid).doc


def _turn(i: int) -> Message:
    return Message(message_id=f"m{i:05d}", role=Role.ROLE_USER, content=f"turn number {i}")


def _ids(c: memlane.Client, sid: str) -> list[str]:
    return [
        m.message_id
        for m in memlane.iter_pages(lambda t: c.list_messages(session_id=sid, page_token=t), "messages")
    ]


def _sessions_on(
    c: memlane.Client, cluster: Cluster, prefix: str, want: Callable[[set[str]], bool], **kw: Any
) -> dict[str, str]:
    """Creates sessions until ``want(masters covered)``; returns session id -> owning master."""
    out: dict[str, str] = {}
    for _ in range(200):
        sid = c.create_session(user_id="u-cluster", **kw).session.session_id
        out[sid] = cluster.master_of(_doc(prefix, sid))
        if want(set(out.values())):
            return out
    raise AssertionError("could not place sessions on the wanted masters")


def test_expiry_events_arrive_from_every_master(cluster: Cluster, start_server: ServerFactory) -> None:
    # The sweeper effectively off: only keyspace events can end these sessions.
    srv = start_server(redis_url=cluster.url, ltm_enabled=False, lifecycle_sweep_interval_seconds=3600)
    subs = srv.sidecar.lifecycle.subscriptions
    masters = {n for n, i in cluster.nodes().items() if "master" in i["flags"] and i["slots"]}
    wait_for(
        lambda: subs.all_live.is_set() and subs.nodes == masters,
        timeout=20,
        describe=lambda: f"masters {sorted(masters)}, listeners {subs.state}",
    )
    prefix = srv.settings.redis.key_prefix
    with memlane.Client(srv.target, timeout=10) as c:
        placed = _sessions_on(c, cluster, prefix, lambda got: got == masters, ttl_seconds=1)
        assert set(placed.values()) == masters  # every master owns at least one of them

        def all_expired() -> bool:
            return all(
                c.get_session(session_id=s).session.status == SessionStatus.SESSION_STATUS_EXPIRED
                for s in placed
            )

        wait_for(all_expired, timeout=30)


def test_wait_for_replicas_refuses_an_unconfirmed_append(
    cluster: Cluster, start_server: ServerFactory
) -> None:
    durable = start_server(
        redis_url=cluster.url, ltm_enabled=False, redis_wait_replicas=1, redis_wait_timeout_ms=300
    )
    fast = start_server(
        redis_url=cluster.url, ltm_enabled=False, key_prefix=durable.settings.redis.key_prefix
    )
    no_retry = memlane.RetryPolicy(max_attempts=1)
    with (
        memlane.Client(durable.target, timeout=10, retry=no_retry) as c,
        memlane.Client(fast.target, timeout=10, retry=no_retry) as f,
    ):
        sid = c.create_session(user_id="u-wait").session.session_id
        c.append_messages(session_id=sid, messages=[_turn(0)])  # replica up: confirmed
        replica = cluster.replica_of(cluster.master_of(_doc(durable.settings.redis.key_prefix, sid)))
        os.kill(cluster.pid(replica), signal.SIGSTOP)
        try:
            with pytest.raises(memlane.UnavailableError, match="replicas"):
                c.append_messages(session_id=sid, messages=[_turn(1)])
            # Without the option the same append is answered at once (the master has it).
            f.append_messages(session_id=sid, messages=[_turn(2)])
        finally:
            os.kill(cluster.pid(replica), signal.SIGCONT)
        out = c.append_messages(session_id=sid, messages=[_turn(1), _turn(3)])  # replica back: confirmed
        assert [r.duplicate for r in out.results] == [True, False]
        assert _ids(c, sid) == ["m00000", "m00001", "m00002", "m00003"]


class _Appender(threading.Thread):
    """Appends one message at a time, recording which ones the server acknowledged."""

    def __init__(self, target: str, sid: str) -> None:
        super().__init__(daemon=True)
        self.target, self.sid = target, sid
        self.acked: list[str] = []
        self.failed = 0
        self.halt = threading.Event()

    def run(self) -> None:
        with memlane.Client(self.target, timeout=10) as c:
            i = 0
            while not self.halt.is_set():
                try:
                    c.append_messages(session_id=self.sid, messages=[_turn(i)])
                    self.acked.append(f"m{i:05d}")
                except memlane.MemlaneError:
                    self.failed += 1
                i += 1


@pytest.fixture()
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster of its own: this test kills one of its masters."""
    yield from _start(tmp_path_factory)


def test_master_sigkill_loses_no_acknowledged_append(
    start_server: ServerFactory, own_cluster: Cluster
) -> None:
    cluster = own_cluster
    srv = start_server(
        redis_url=cluster.url,
        ltm_enabled=False,
        redis_wait_replicas=1,
        redis_wait_timeout_ms=1000,
        lifecycle_sweep_interval_seconds=3600,
    )
    try:
        subs = srv.sidecar.lifecycle.subscriptions
        wait_for(lambda: subs.all_live.is_set() and len(subs.nodes) == 3, timeout=20)
        prefix = srv.settings.redis.key_prefix
        with memlane.Client(srv.target, timeout=10) as c:
            sid = c.create_session(user_id="u-failover", ttl_seconds=3600).session.session_id
            master = cluster.master_of(_doc(prefix, sid))
            replica = cluster.replica_of(master)
            appender = _Appender(srv.target, sid)
            appender.start()
            try:
                wait_for(lambda: len(appender.acked) >= 20, timeout=30)
                os.kill(cluster.pid(master), signal.SIGKILL)
                before = len(appender.acked)
                # The replica takes over (node timeout 2 s + election) and appends are acknowledged again.
                wait_for(lambda: "master" in cluster.nodes().get(replica, {}).get("flags", ""), timeout=30)
                # Until the dead node is back (as the new master's replica) nothing can confirm a write
                # on that shard: appends there are refused, not acknowledged at risk.
                cluster.restart(master)
                wait_for(lambda: len(appender.acked) >= before + 20, timeout=60)
            finally:
                appender.halt.set()
                appender.join(30)
            stored = set(_ids(c, sid))
            lost = [m for m in appender.acked if m not in stored]
            assert not lost, f"acknowledged but lost after failover: {lost}"
            assert len(stored) >= len(appender.acked) > 0

            # The promoted replica's expiry events reach the sidecar (re-subscribed on topology change).
            wait_for(lambda: replica in subs.nodes and master not in subs.nodes, timeout=20)
            placed = _sessions_on(c, cluster, prefix, lambda got: replica in got, ttl_seconds=1)
            on_new = [s for s, m in placed.items() if m == replica]
            wait_for(
                lambda: all(
                    c.get_session(session_id=s).session.status == SessionStatus.SESSION_STATUS_EXPIRED
                    for s in on_new
                ),
                timeout=30,
            )
    finally:
        srv.stop()  # before its cluster goes


def test_durable_appends_resume_at_once_when_the_old_master_is_back_as_a_replica(
    start_server: ServerFactory, own_cluster: Cluster
) -> None:
    """No append meanwhile, so the sidecar's slot map still names the dead master when it comes back as
    its replica's replica: the first durable append meets the stale map (the script is redirected, the
    WAIT lands on a replica). It may be refused once, but the refusal refreshes the map, so appends are
    acknowledged again within seconds (once they were refused for a minute)."""
    cluster = own_cluster
    srv = start_server(
        redis_url=cluster.url,
        ltm_enabled=False,
        redis_wait_replicas=1,
        redis_wait_timeout_ms=1000,
        lifecycle_sweep_interval_seconds=3600,
    )
    try:
        prefix = srv.settings.redis.key_prefix
        with memlane.Client(srv.target, timeout=10, retry=memlane.NO_RETRY) as c:
            sid = c.create_session(user_id="u-stale-map", ttl_seconds=3600).session.session_id
            c.append_messages(session_id=sid, messages=[_turn(0)])  # positive control: durable appends work
            master = cluster.master_of(_doc(prefix, sid))
            replica = cluster.replica_of(master)
            os.kill(cluster.pid(master), signal.SIGKILL)
            wait_for(lambda: "master" in cluster.nodes().get(replica, {}).get("flags", ""), timeout=30)
            cluster.restart(master)
            wait_for(lambda: "slave" in cluster.nodes().get(master, {}).get("flags", ""), timeout=30)
            started, refused = time.monotonic(), 0
            while True:
                try:
                    c.append_messages(session_id=sid, messages=[_turn(1 + refused)])
                    break
                except memlane.UnavailableError:
                    refused += 1
                    assert time.monotonic() - started < 10, f"durable appends refused for 10 s ({refused})"
                    time.sleep(0.2)
    finally:
        srv.stop()


def test_stop_after_every_node_is_gone(start_server: ServerFactory, own_cluster: Cluster) -> None:
    """With no node left, redis-py raises RedisClusterException (not a RedisError) from the expiry
    listeners' reconnects: they died for good and Sidecar.stop() re-raised it."""
    srv = start_server(redis_url=own_cluster.url, ltm_enabled=False)
    subs = srv.sidecar.lifecycle.subscriptions
    wait_for(lambda: subs.all_live.is_set() and len(subs.nodes) == 3, timeout=20)
    own_cluster.stop()
    wait_for(lambda: not subs.nodes, timeout=20)  # every listener saw its node go and is reconnecting
    srv.stop()  # raised RedisClusterException before the fix
