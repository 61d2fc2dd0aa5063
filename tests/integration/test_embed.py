"""Embed and SearchMemories by query vector through the real server (for frameworks that embed on their
own, such as CrewAI): the vectors are the ones memories are indexed with, so recall by an Embed vector
equals recall by the text; the vector never widens what a caller may read; bad vectors and batches are
refused; auditors may not call Embed."""

from __future__ import annotations

import asyncio
import math
import time
import uuid

import pytest

import memlane
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from tests.access_policy import tokens_policy
from tests.conftest import ServerFactory

FACTS = ["Dana is allergic to peanuts.", "Dana lives in Lisbon.", "Dana's favourite colour is green."]


def _ids(hits: mpb.SearchMemoriesResponse) -> list[str]:
    return [h.memory.memory_id for h in hits.results]


def test_recall_by_an_embed_vector_equals_recall_by_its_text(client: memlane.Client, user_id: str) -> None:
    me = mpb.Caller(user_id=user_id)
    for fact in FACTS:
        client.create_memory(caller=me, kind=mpb.MEMORY_KIND_FACT, content=fact)
    query = "what is Dana allergic to?"
    out = client.embed(texts=[query, "Lisbon"])
    assert out.dimensions == 384 and [len(e.values) for e in out.embeddings] == [384, 384]
    assert math.isclose(sum(x * x for x in out.embeddings[0].values), 1.0, rel_tol=1e-4)  # normalized
    vector = list(out.embeddings[0].values)
    by_text = client.search_memories(caller=me, query=query, mode=mpb.SEARCH_MODE_VECTOR)
    by_vector = client.search_memories(caller=me, query_vector=vector)  # no text: vector-only
    assert _ids(by_vector) == _ids(by_text) and by_vector.results[0].memory.content == FACTS[0]
    assert [round(h.parts.vector_similarity, 4) for h in by_vector.results] == [
        round(h.parts.vector_similarity, 4) for h in by_text.results
    ]
    # With a text too, the vector replaces the embedding of the text in hybrid recall.
    hybrid = client.search_memories(caller=me, query="peanuts", query_vector=list(out.embeddings[1].values))
    top = {h.memory.content: h.parts for h in hybrid.results}
    assert top[FACTS[0]].keyword_rank == 1 and top[FACTS[1]].vector_rank == 1


def test_a_vector_never_widens_what_a_caller_reads(client: memlane.Client, user_id: str) -> None:
    client.create_memory(caller=mpb.Caller(user_id=user_id), kind=mpb.MEMORY_KIND_FACT, content=FACTS[0])
    vector = list(client.embed(texts=[FACTS[0]]).embeddings[0].values)
    other = mpb.Caller(user_id=f"{user_id}-other")
    assert client.search_memories(caller=other, query_vector=vector).results == []
    # Positive control: the owner finds it with the same vector.
    assert len(client.search_memories(caller=mpb.Caller(user_id=user_id), query_vector=vector).results) == 1


def test_bad_embeds_and_vectors_are_refused(client: memlane.Client, user_id: str) -> None:
    me = mpb.Caller(user_id=user_id)
    with pytest.raises(memlane.InvalidArgumentError, match="empty"):
        client.embed(texts=[])
    with pytest.raises(memlane.InvalidArgumentError, match="at most 256"):
        client.embed(texts=["x"] * 257)
    with pytest.raises(memlane.InvalidArgumentError, match="longer than"):
        client.embed(texts=["x" * (64 * 1024 + 1)])
    with pytest.raises(memlane.InvalidArgumentError, match="384"):
        client.search_memories(caller=me, query_vector=[0.1] * 10)
    for bad in ([0.0] * 384, [math.nan] * 384, [math.inf] + [0.0] * 383):
        with pytest.raises(memlane.InvalidArgumentError, match="finite"):
            client.search_memories(caller=me, query_vector=bad)
    with pytest.raises(memlane.InvalidArgumentError, match="query is required"):
        client.search_memories(caller=me, query_vector=[0.1] * 384, mode=mpb.SEARCH_MODE_KEYWORD)
    with pytest.raises(memlane.InvalidArgumentError, match="query is required"):
        client.search_memories(caller=me)
    assert len(client.embed(texts=["x"] * 256).embeddings) == 256  # positive control: the limit itself


TOKENS = {a: f"tok-{a}-{uuid.uuid4().hex[:6]}" for a in ("alpha", "auditor")}


@pytest.fixture(scope="module")
def secured(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> SidecarThread:
    path = tokens_policy(tmp_path_factory.mktemp("policy") / "policy.yaml", TOKENS)
    return start_server(auth_required=True, access_policy_file=str(path))


def test_embed_needs_an_identity_and_is_not_for_auditors(secured: SidecarThread) -> None:
    with (
        memlane.Client(secured.target, token="not-a-token", timeout=10) as nobody,
        pytest.raises(memlane.UnauthenticatedError),
    ):
        nobody.embed(texts=["x"])
    with (
        memlane.Client(secured.target, token=TOKENS["auditor"], timeout=10) as auditor,
        pytest.raises(memlane.PermissionDeniedError),
    ):
        auditor.embed(texts=["x"])
    with memlane.Client(secured.target, token=TOKENS["alpha"], timeout=10) as alpha:
        assert alpha.embed(texts=["x"]).dimensions == 384


def _long_text(tag: str, chars: int) -> str:
    """English-like text (a distinct opening per call, so no call is answered from the vector cache)."""
    sentence = "The quarterly report lists every shipment we sent to the northern warehouses last spring. "
    return (f"{tag}: " + sentence * (chars // len(sentence) + 1))[:chars]


def test_a_long_text_costs_what_its_head_costs(server: SidecarThread) -> None:
    """The model reads 256 tokens; the tokenizer used to read all of every text first (250 texts of
    63 KB held the embedding worker, which promotion shares, for minutes). One unbroken run of letters
    is a single [UNK] token, so the model's own work is the same for every length and only reading
    the text differs."""

    def timed(c: memlane.Client, texts: list[str]) -> tuple[float, list[list[float]]]:
        start = time.perf_counter()
        out = c.embed(texts=texts).embeddings
        return time.perf_counter() - start, [list(e.values) for e in out]

    def batch(tag: str, chars: int) -> list[str]:
        return [f"{tag}{i} " + "x" * chars for i in range(32)]

    with memlane.Client(server.target, timeout=120) as c:
        short = min(timed(c, batch(f"short{run}", 2048))[0] for run in range(2))
        long = min(timed(c, batch(f"long{run}", 63 * 1024))[0] for run in range(2))
        assert long < 3 * short + 0.1, (short, long)
        # Positive control: the vector is the one of the text the model reads, not of a shorter one.
        text = _long_text("report", 63 * 1024)
        _, (whole, head, shorter) = timed(c, [text, text[:2048], text[:400]])
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(whole, head, strict=True))
    assert not all(math.isclose(a, b, abs_tol=1e-3) for a, b in zip(head, shorter, strict=True))
    print(f"32 texts: 2 KB {short * 1000:.0f} ms, 63 KB {long * 1000:.0f} ms")


@pytest.fixture(scope="module")
def no_queue(start_server: ServerFactory) -> SidecarThread:
    # The default admission_limits; no queue, so calls beyond the Embed gate are shed at once.
    return start_server(admission_max_queue=0, admission_max_wait_ms=0)


def test_embed_has_its_own_admission_gate(no_queue: SidecarThread, user_id: str) -> None:
    texts = [_long_text(f"gate {i}", 400) for i in range(64)]

    async def one(c: memlane.AsyncClient, i: int) -> str:
        try:
            await c.embed(texts=[f"{i} {t}" for t in texts])
            return "ok"
        except memlane.ResourceExhaustedError as exc:
            assert exc.reason == "OVERLOADED" and exc.retry_after is not None
            return "shed"

    async def run() -> tuple[list[str], str]:
        async with memlane.AsyncClient(no_queue.target, timeout=120, retry=memlane.NO_RETRY) as c:
            calls = [asyncio.create_task(one(c, i)) for i in range(8)]
            # Other calls keep their own gates while Embed is full.
            sid = (await c.create_session(user_id=user_id)).session.session_id
            return list(await asyncio.gather(*calls)), sid

    results, sid = asyncio.run(run())
    assert results.count("shed") >= 1 and results.count("ok") >= 2, results
    assert sid


def test_an_embed_call_over_its_cost_is_refused_before_any_work(server: SidecarThread) -> None:
    """250 texts of 63 KB would hold the model for a minute: refused at once, naming the limit."""
    with memlane.Client(server.target, timeout=120, retry=memlane.NO_RETRY) as c:
        huge = [_long_text(f"huge {i}", 63 * 1024) for i in range(250)]
        with pytest.raises(memlane.ResourceExhaustedError, match="embedding_max_call_tokens") as refused:
            c.embed(texts=huge)
        assert refused.value.reason == "EMBEDDING_TOO_LARGE" and refused.value.field == "texts"
        assert refused.value.retry_after is None  # a retry cannot help: the call itself is too costly
        # Positive control: as many short texts, and a few of the long ones, are embedded.
        assert len(c.embed(texts=[f"short {i}" for i in range(250)]).embeddings) == 250
        assert len(c.embed(texts=huge[:8]).embeddings) == 8


@pytest.fixture(scope="module")
def small_budget(start_server: ServerFactory) -> SidecarThread:
    # Room for one costly call in flight, and no per-method gate, so only the embedding budget sheds; a
    # call that finds no room is refused at once instead of waiting for it.
    return start_server(
        admission_limits="Embed=0,*=64",
        admission_max_wait_ms=0,
        embedding_max_call_tokens=8192,
        embedding_max_inflight_tokens=8192,
    )


def test_callers_embedding_work_in_flight_is_bounded(small_budget: SidecarThread, user_id: str) -> None:
    texts = [_long_text(f"budget {k}", 2048) for k in range(32)]  # 32 x 256 tokens: the whole budget

    async def one(c: memlane.AsyncClient, i: int) -> str:
        try:
            await c.embed(texts=[f"{i} {t}" for t in texts])
            return "ok"
        except memlane.ResourceExhaustedError as exc:
            assert exc.reason == "EMBEDDING_BUSY" and exc.retry_after is not None
            assert "embedding_max_inflight_tokens" in str(exc)
            return "shed"

    async def run() -> list[str]:
        async with memlane.AsyncClient(small_budget.target, timeout=120, retry=memlane.NO_RETRY) as c:
            return list(await asyncio.gather(*(one(c, i) for i in range(6))))

    results = asyncio.run(run())
    # One call holds the whole budget while it runs, and a call finding no room does not wait: of calls
    # sent together, the first is admitted and the others, arriving while it embeds, are refused.
    assert results.count("shed") >= 1 and results.count("ok") >= 1, results
    # Positive control: one after the other, every call is admitted.
    with memlane.Client(small_budget.target, timeout=120, retry=memlane.NO_RETRY) as c:
        for i in range(3):
            assert len(c.embed(texts=[f"seq {i} {t}" for t in texts]).embeddings) == 32
