"""The session-end row: many 50-turn sessions ending at once (as when their TTLs expire together), each
closed and promoted through ``PromoteSession``; the rate is sessions fully ended per second."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import memlane
from memlane import Message, Role

from ..config import Settings
from ..embedding import OnnxEmbedder, default_spec
from ..extraction.episodes import build_episodes
from ..ltm.ingest import embedding_text
from ..sessions.model import Message as Turn
from ..sessions.model import Role as TurnRole
from ..sessions.model import Session
from .report import Report
from .runner import Latency, percentiles

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
