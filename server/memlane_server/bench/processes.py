"""The rows of ``memlane serve``'s processes: how fast it starts, how fast its workers end sessions, and
how little that work touches the serving process.

- **Start-up**: ``memlane serve`` with its defaults (embedded Redis, long-term memory on, a fresh data
  directory) from process start until its gRPC health service answers SERVING.
- **Session end**: many 50-turn sessions ending at once (as when their TTLs expire together), each
  closed and promoted through ``PromoteSession``; the rate is sessions fully ended per second.
- **Isolation**: while the worker promotes a session holding one 120 KB turn (``"a." * 60000``, the
  input that froze the single-process sidecar for minutes) and ten ordinary sessions, the serving
  process answers gRPC health probes and appends of another session as if nothing were queued.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import memlane
from memlane import Message, PromotionState, Role
from memlane.v1 import memory_pb2

from ..config import Settings
from ..embedding import OnnxEmbedder, default_spec
from ..extraction.episodes import build_episodes
from ..ltm.ingest import embedding_text
from ..sessions.model import Message as Turn
from ..sessions.model import Role as TurnRole
from ..sessions.model import Session
from .runner import Latency, Process, Report, children_of, free_port, percentiles, rollup_mb

# Start-up.

IDLE_SETTLE_S = 8.0  # after the worker started: its start-up (imports, table, Redis) is over by then

TARGET_S = 3.0


@dataclass(frozen=True, slots=True)
class _Memory:
    """A default serve's memory, idle and after the README quick start's calls: every process's pages
    once (``Process.pod_mb``), and each process's PSS."""

    idle_mb: float
    light_mb: float
    idle_pss: dict[str, float]
    light_pss: dict[str, float]


def _one(data_dir: str, port: int, *, memory: bool = False) -> tuple[float, _Memory | None, str]:
    """Seconds to healthy; with ``memory``, the memory of every process once the workers are up and have
    been idle a few seconds, and again after the quick start's calls (else None). Also what the start
    wrote on stderr besides log lines."""
    target = f"127.0.0.1:{port}"
    args = ["--listen", target, "--admin-listen", "", "--data-dir", data_dir, "--log-format", "json"]
    proc = Process([sys.executable, "-m", "memlane_server.cli", "serve", *args])
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc.start(stderr=err)
        try:
            took = _healthy(proc, target, t0)
            measured = None
            if memory:
                _workers_running(proc)
                time.sleep(IDLE_SETTLE_S)
                idle_mb, idle_pss = proc.pod_mb(), _pss_by_process(proc)
                _quick_start(target)
                time.sleep(LIGHT_SETTLE_S)
                measured = _Memory(idle_mb, proc.pod_mb(), idle_pss, _pss_by_process(proc))
        finally:
            proc.stop()
        err.seek(0)
        others = [line for line in err.read().decode(errors="replace").splitlines() if not _log_line(line)]
    return took, measured, "\n".join(others)


LIGHT_SETTLE_S = 3.0  # after the quick start: the worker's jobs for it are done


def _quick_start(target: str) -> None:
    """The README's quick start: its six calls, as a new user makes them."""
    with memlane.Memlane(target, agent_id="support-bot") as m:
        turns = [
            {"role": "user", "content": "My order 4417 arrived damaged."},
            {"role": "assistant", "content": "Sorry! I'll arrange a replacement."},
        ]
        m.add("alice", "chat-1", turns)
        m.remember("alice", "Prefers email over phone calls.", kind=memlane.MemoryKind.MEMORY_KIND_PREFERENCE)
        m.search("alice", "how should we contact her?")
        m.context("chat-1", "where is my replacement?", model="gpt-4o-mini")
    with memlane.Memlane(target) as operator:
        operator.forget_user("alice")


def _pss_by_process(proc: Process) -> dict[str, float]:
    """PSS in MB of the serving process and each child, by what it is."""
    assert proc.proc is not None
    out = {"serving": rollup_mb(proc.proc.pid, "Pss:")}
    for kid in children_of(proc.proc.pid):
        cmdline = Path(f"/proc/{kid}/cmdline").read_bytes()
        part = (
            "redis" if b"redis" in cmdline else "model" if b"memlane_server.children" in cmdline else "worker"
        )
        out[part] = out.get(part, 0.0) + rollup_mb(kid, "Pss:")
    return out


def _pss_note(pss: dict[str, float]) -> str:
    return "PSS " + ", ".join(f"{part} {mb:.0f}" for part, mb in pss.items()) + " MB"


def _healthy(proc: Process, target: str, t0: float) -> float:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = t0 + 60
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return time.perf_counter() - t0
            except grpc.RpcError:
                pass
            if time.perf_counter() > deadline or (proc.proc and proc.proc.poll() is not None):
                raise RuntimeError("memlane serve did not become healthy")
            time.sleep(0.02)


def _workers_running(proc: Process) -> None:
    """Until the worker process has loaded what it loads (its memory is then what it idles at)."""
    assert proc.proc is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        kids = children_of(proc.proc.pid)
        if any(b"memlane_server.cli" in Path(f"/proc/{k}/cmdline").read_bytes() for k in kids):
            return
        time.sleep(0.1)


def _log_line(line: str) -> bool:
    """A JSON log line at info level (or the auth notice every development start gives)."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and (
        record.get("level") in ("debug", "info") or str(record.get("msg", "")).startswith("auth is disabled")
    )


def startup(report: Report, data_root: str, runs: int) -> None:
    results = [_one(f"{data_root}/{k}", free_port(), memory=k == runs - 1) for k in range(runs)]
    p50, p99 = percentiles([took for took, _, _ in results])
    noise = next((err for _, _, err in results if err), "")
    report.latency(
        Latency(f"memlane serve start to healthy (embedded Redis, LTM on), {runs} starts", p50, p99, runs),
        p50_ms=TARGET_S * 1000,
        note=f"stderr besides log lines: {noise[:300]!r}" if noise else "nothing on stderr but log lines",
    )
    memory = results[-1][1]
    assert memory is not None
    report.memory(
        "memory of a default memlane serve, idle, LTM on (all processes, each page once)",
        memory.idle_mb,
        at_most=IDLE_MB,
        note=_pss_note(memory.idle_pss),
    )
    # What the chart's memory request is sized from (charts/memlane/values.yaml, docs/operations.md).
    report.memory(
        "memory of a default memlane serve after the README quick start (all processes, each page once)",
        memory.light_mb,
        at_most=LIGHT_MB,
        note=f"{_pss_note(memory.light_pss)}; the serving process"
        f" {memory.light_pss['serving'] - memory.idle_pss['serving']:+.0f} MB PSS since idle",
    )


IDLE_MB = 520  # measured 498-503 MB (both tiktoken encodings built at start)
LIGHT_MB = 560  # measured 526-531 MB; the chart's request (640Mi) leaves it near 82%


# Session end.

TURNS = 50
TARGET_PER_S = 6.0


def _turns(k: int) -> list[Message]:
    return [
        Message(
            role=Role.ROLE_USER if j % 2 == 0 else Role.ROLE_ASSISTANT,
            content=f"Turn {j}: I prefer window seats; my booking ref is BK{k}{j:03d}.",
        )
        for j in range(TURNS)
    ]


async def _end_all(target: str, sessions: int) -> tuple[float, list[float]]:
    async with memlane.AsyncClient(target, timeout=300) as c:
        sids = []
        for k in range(sessions):
            sid = (await c.create_session(user_id=f"ender-{k}", agent_id="bench-agent")).session.session_id
            await c.append_messages(session_id=sid, messages=_turns(k))
            sids.append(sid)

        async def end(sid: str) -> float:
            t0 = time.perf_counter()
            await c.promote_session(session_id=sid, close=True)
            return time.perf_counter() - t0

        t0 = time.perf_counter()
        each = await asyncio.gather(*(end(s) for s in sids))
        return time.perf_counter() - t0, list(each)


def _episode_texts(k: int) -> list[str]:
    """What promotion embeds for the bench's session ``k``: one text per turn (episodes)."""
    now = int(time.time() * 1000)
    s = Session(session_id=f"s{k}", user_id=f"ender-{k}", agent_id="bench-agent", created_at_ms=now)
    turns = [
        Turn(f"m{j}", s.session_id, TurnRole(int(m.role)), m.content, seq=j + 1, created_at_ms=now)
        for j, m in enumerate(_turns(k))
    ]
    return [embedding_text(e.content, e.keywords) for e in build_episodes(turns, s)]


def model_ceiling(sessions: int) -> float:
    """Sessions a second the embedding model alone allows on this machine: the episodes of ``sessions``
    sessions embedded in the model's bulk lane, in this process, with the sidecar's thread count."""
    texts = [t for k in range(sessions) for t in _episode_texts(k)]
    model = OnnxEmbedder.load(default_spec(), bulk_threads=Settings().embedding.embedding_threads)

    async def embed_all() -> float:
        t0 = time.perf_counter()
        await model.embed(texts, bulk=True)
        took = time.perf_counter() - t0
        await model.close()
        return took

    return sessions / asyncio.run(embed_all())


def session_end(
    report: Report,
    target: str,
    sessions: int,
    *,
    label: str = "",
    texts: Callable[..., float] | None = None,
) -> None:
    """``label`` names a sidecar other than the default one (its rows are apart); the model's ceiling
    is measured with the default's rows. ``texts``: the sidecar's counter reader, for the texts its model
    ran per session ending (learning during the session included: every text of these sessions)."""
    before = texts("memlane_embedding_texts") if texts else 0.0
    suffix = f", {label}" if label else ""
    if not label:
        report.rate(
            f"session end ceiling: the embedding model alone ({TURNS} episodes a session)",
            model_ceiling(sessions),
        )
    elapsed, each = asyncio.run(_end_all(target, sessions))
    p50, p99 = percentiles(each)
    report.latency(
        Latency(
            f"session end ({TURNS} turns, promote + archive), each of {sessions} at once{suffix}",
            p50,
            p99,
            sessions,
        )
    )
    note = ""
    if texts:
        per_session = (texts("memlane_embedding_texts") - before) / sessions
        note = f"texts embedded per session: {per_session:.1f} ({TURNS} turns)"
    report.rate(
        f"session end with promotion, {sessions} sessions ending at once{suffix}",
        sessions / elapsed,
        at_least=TARGET_PER_S,
        note=note,
    )


# Isolation.

HOSTILE = "a." * 60000
ORDINARY = 10
ISOLATION_TURNS = 50
LIMIT_S = 120.0  # the row stops probing then, ended or not (the figure says how many ended)


def _sessions(c: memlane.Client) -> list[str]:
    hostile = c.create_session(user_id="isolation-0", agent_id="bench-agent").session.session_id
    c.append_messages(
        session_id=hostile,
        messages=[
            Message(role=Role.ROLE_USER, content=HOSTILE),
            Message(role=Role.ROLE_ASSISTANT, content="Ok."),
        ],
    )
    out = [hostile]
    for k in range(1, ORDINARY + 1):
        sid = c.create_session(user_id=f"isolation-{k}", agent_id="bench-agent").session.session_id
        c.append_messages(
            session_id=sid,
            messages=[
                Message(
                    role=Role.ROLE_USER if j % 2 == 0 else Role.ROLE_ASSISTANT,
                    content=f"Turn {j}: my locker is L-{k}{j:03d} and I prefer the early shift.",
                )
                for j in range(ISOLATION_TURNS)
            ],
        )
        out.append(sid)
    return out


def isolation(report: Report, target: str, *, searcher: str = "searcher") -> None:
    """``searcher``: a user with memories, whose searches (a query embedding each) are timed too."""
    health_s: list[float] = []
    append_s: list[float] = []
    search_s: list[float] = []
    with memlane.Client(target, timeout=60) as c, grpc.insecure_channel(target) as channel:
        probe = health_pb2_grpc.HealthStub(channel)
        ending = _sessions(c)
        live = c.create_session(user_id="isolation-live", agent_id="bench-agent").session.session_id
        caller = memory_pb2.Caller(user_id=searcher, agent_id="bench-agent")
        for sid in ending:
            c.close_session(session_id=sid)
        t0 = time.perf_counter()
        ended = 0
        while time.perf_counter() - t0 < LIMIT_S:
            s = time.perf_counter()
            probe.Check(health_pb2.HealthCheckRequest(), timeout=30)
            health_s.append(time.perf_counter() - s)
            s = time.perf_counter()
            c.append_messages(
                session_id=live, messages=[Message(role=Role.ROLE_USER, content="still there?")]
            )
            append_s.append(time.perf_counter() - s)
            s = time.perf_counter()
            c.search_memories(caller=caller, query=f"which locker, question {len(search_s)}?", limit=10)
            search_s.append(time.perf_counter() - s)
            if len(append_s) % 20 == 0:
                states = [c.get_session(session_id=sid).session.promotion_state for sid in ending]
                ended = sum(st == PromotionState.PROMOTION_STATE_ARCHIVED for st in states)
                if ended == len(ending):
                    break
            time.sleep(0.02)
        took = time.perf_counter() - t0
    note = f"{ended} of {len(ending)} sessions ended in {took:.1f} s"
    worst = max(health_s) * 1000  # Latency holds milliseconds
    report.latency(
        Latency(
            "isolation: health probe while a 120 KB turn + 10 sessions are promoted (max)",
            worst,
            worst,
            len(health_s),
        ),
        p99_ms=1000,
        note=note,
    )
    p50, p99 = percentiles(append_s)
    report.latency(
        Latency("isolation: AppendMessages meanwhile", p50, p99, len(append_s)), p99_ms=100, note=note
    )
    p50, p99 = percentiles(search_s)
    report.latency(
        Latency("isolation: SearchMemories meanwhile (a query embedding each)", p50, p99, len(search_s))
    )
