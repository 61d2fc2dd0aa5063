"""The processes a chaos run starts and disturbs, all on loopback: memlane sidecars, Redis (one node with
an fsync-always append-only file, or a 3+3 cluster from scripts/redis-cluster) and an S3 server
(scripts/s3-server, moto). Each offers one disruption: kill -9 and restart (sidecar, Redis node),
kill -9 of a master until its replica takes over and then restart of the dead node (cluster), SIGSTOP
then SIGCONT (object storage)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

import memlane
from memlane_server.bench.runner import children_of

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_base_port(count: int, bus_offset: int = 10000) -> int:
    """A base such that base+1..base+count and their cluster-bus ports are free (checked by binding)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 30000, 10)
        ports = [base + i for i in range(1, count + 1)]
        try:
            for p in ports + [p + bus_offset for p in ports]:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


def wait_until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


class SingleRedis:
    """One redis-server with appendonly yes + appendfsync always: what it acknowledged is on disk, so a
    kill -9 and a restart on the same file must lose nothing."""

    name = "redis"

    def __init__(self, run: Path) -> None:
        self.dir = run / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        args = [
            shutil.which("redis-server") or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--appendonly", "yes", "--appendfsync", "always", "--save", "",
            "--notify-keyspace-events", "Ex", "--hz", "50",
        ]  # fmt: skip
        with (self.dir / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)

        def up() -> bool:
            try:
                return bool(client.ping())
            except (redis.ConnectionError, redis.BusyLoadingError):
                return False

        wait_until(up, 60, "redis to start")
        client.close()

    def disrupt(self, rng: random.Random) -> str:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        time.sleep(rng.uniform(0.2, 1.5))
        self.start()
        self.restarts += 1
        return "redis kill -9 + restart"

    def compact(self) -> None:
        """Between trials: the AOF holds every deleted trial too; a rewrite keeps restarts fast."""
        with redis.Redis(port=self.port) as r:
            r.bgrewriteaof()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


class EmbeddedRedis:
    """The embedded Redis of one sidecar (``--redis embedded``): killed with SIGKILL under it, the sidecar
    must start it again on its append-only file (acknowledged writes kept); killed with its sidecar, it
    must go too (no orphan left on the data dir)."""

    name = "embedded redis"

    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar
        self.url = f"unix://{sidecar.run / sidecar.name / 'redis' / 'redis.sock'}"

    def pid(self) -> int | None:
        owner = self.sidecar.pid
        found = [p for p in children_of(owner) if _is_redis(p)] if owner else []
        return found[0] if found else None

    def disrupt(self, rng: random.Random) -> str:
        pid = self.pid()
        if pid is None:
            return "embedded redis: none running (its sidecar is restarting)"
        os.kill(pid, signal.SIGKILL)
        return f"embedded redis kill -9 (pid {pid}); its sidecar starts it again"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def _state(pid: int) -> str:
    """A process's state letter (R, S, T, Z, ...), "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _is_redis(pid: int) -> bool:
    try:
        return b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def redis_servers_in(data_dir: Path) -> list[int]:
    """Live redis-servers working in ``data_dir``'s redis/ (asked while its sidecar is dead, any is an
    orphan: a sidecar killed with SIGKILL must take its Redis along)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _is_redis(int(entry.name)):
            try:
                same = Path(os.readlink(entry / "cwd")) == (data_dir / "redis").resolve()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if same and state != "Z":
                out.append(int(entry.name))
    return out


class ClusterRedis:
    """scripts/redis-cluster (3 masters + 3 replicas, node timeout 2 s); the disruption kills a master,
    waits for its replica to be promoted, then restarts the dead node (it rejoins as a replica)."""

    name = "redis cluster"

    def __init__(self, run: Path) -> None:
        self.dir = run / "cluster"
        self.base = free_base_port(6)
        self.url = ""
        self.failovers = 0

    def start(self) -> None:
        out = subprocess.run(
            [str(ROOT / "scripts" / "redis-cluster"), "start", str(self.dir), str(self.base)],
            check=True, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        self.url = out.stdout.strip().splitlines()[-1]

    def _nodes(self, port: int) -> dict[str, dict[str, Any]]:
        """CLUSTER NODES as one node sees it: ``host:port`` -> flags (a set), master id, node id, slots."""
        with redis.Redis(port=port, socket_connect_timeout=1, socket_timeout=2) as r:
            parsed: dict[str, dict[str, Any]] = r.execute_command("CLUSTER NODES")  # parsed by redis-py
        return {
            addr: {
                "id": info["node_id"],
                "flags": set(str(info["flags"]).split(",")),
                "master": info["master_id"],
                "slots": info["slots"],
            }
            for addr, info in parsed.items()
        }

    def disrupt(self, rng: random.Random) -> str:
        ports = [self.base + i for i in range(1, 7)]
        nodes = self._nodes(rng.choice(ports))
        masters = [
            n for n, i in nodes.items() if "master" in i["flags"] and "fail" not in i["flags"] and i["slots"]
        ]
        victim = rng.choice(masters)
        vport = int(victim.rsplit(":", 1)[1])
        replicas = [n for n, i in nodes.items() if i["master"] == nodes[victim]["id"]]
        pid = int((self.dir / str(vport) / "redis.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        witness = next(p for p in ports if p != vport)

        def promoted() -> bool:
            try:
                now = self._nodes(witness)
            except redis.RedisError:
                return False
            return any("master" in now.get(r, {}).get("flags", []) for r in replicas)

        wait_until(promoted, 60, f"a replica of {victim} to be promoted")
        subprocess.run(
            [str(ROOT / "scripts" / "redis-cluster"), "restart-node", str(self.dir), str(vport)],
            check=True, timeout=60,
        )  # fmt: skip
        self.failovers += 1
        return f"failover of master {victim}"

    def compact(self) -> None:
        pass

    def stop(self) -> None:
        subprocess.run(
            [str(ROOT / "scripts" / "redis-cluster"), "stop", str(self.dir)], check=False, timeout=120
        )


class ObjectStore:
    """scripts/s3-server (moto) on a free port; ``disrupt`` pauses it (SIGSTOP) for a while."""

    name = "object storage"

    def __init__(self, run: Path, bucket: str = "memlane") -> None:
        self.run, self.bucket = run, bucket
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.pauses = 0

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "chaos",
            "AWS_SECRET_ACCESS_KEY": "chaos",
            "AWS_REGION": "us-east-1",
        }

    def start(self) -> None:
        script = ROOT / "scripts" / "s3-server"
        if not script.exists():
            raise SystemExit("--objstore needs scripts/s3-server (the objstore branch)")
        ready = self.run / "s3.ready"
        ready.unlink(missing_ok=True)
        args = [
            sys.executable,
            str(script),
            "--port",
            str(self.port),
            "--bucket",
            self.bucket,
            "--ready-file",
            str(ready),
        ]
        with (self.run / "s3.log").open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        wait_until(ready.exists, 60, "the S3 server")

    def disrupt(self, rng: random.Random) -> str:
        assert self.proc is not None
        pause = rng.uniform(0.5, 3.0)
        self.proc.send_signal(signal.SIGSTOP)
        time.sleep(pause)
        self.proc.send_signal(signal.SIGCONT)
        self.pauses += 1
        return f"object storage paused {pause:.1f} s"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Sidecar:
    """One ``memlane serve`` process on a Unix socket."""

    def __init__(self, run: Path, name: str, flags: list[str], env: dict[str, str]) -> None:
        self.run, self.name, self.flags, self.extra_env = run, name, flags, env
        self.sock = run / f"{name}.sock"
        self.target = f"unix:{self.sock}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def start(self) -> None:
        self.sock.unlink(missing_ok=True)
        args = [
            sys.executable, "-m", "memlane_server.cli", "serve", "--listen", self.target,
            "--admin-listen", "", "--data-dir", str(self.run / self.name), *self.flags,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMLANE_", "AWS_"))}
        env["PYTHONPATH"] = f"{ROOT / 'client_py'}:{ROOT / 'server'}"
        env.update(self.extra_env)
        with (self.run / f"{self.name}.log").open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 180
        with memlane.Client(self.target, timeout=2, retry=memlane.NO_RETRY) as c:
            while True:
                try:
                    c.get_session(session_id="ready-probe")
                except memlane.NotFoundError:
                    return
                except memlane.MemlaneError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise RuntimeError(
                            f"sidecar {self.name} did not start (see {self.run}/{self.name}.log)"
                        ) from None
                    time.sleep(0.1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def worker_pids(self) -> list[int]:
        """Its worker processes (``memlane worker`` children); a kill or a stop of one must lose nothing."""
        return [p for p in self._parts() if b" worker " in _cmdline(p)]

    def model_pids(self) -> list[int]:
        """Its model process (``memlane_server.children``), when long-term memory is on."""
        return [p for p in self._parts() if b"memlane_server.children" in _cmdline(p)]

    def stopped_parts(self) -> list[int]:
        """Its children in the stopped state (T): a SIGSTOPped part its sidecar has not replaced yet."""
        return [p for p in self._parts() if _state(p) == "T"]

    def _parts(self) -> list[int]:
        """The processes this sidecar started but an embedded Redis."""
        if not self.alive():
            return []
        assert self.proc is not None
        return [p for p in children_of(self.proc.pid) if not _is_redis(p)]

    def kill9(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.kills += 1

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill9()
