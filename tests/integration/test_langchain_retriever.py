"""``MemlaneRetriever``: LangChain's retriever interface over SearchMemories, documents in recall
order with the score parts as metadata, and exactly the memories the retrieving agent may read."""

from __future__ import annotations

import uuid

import pytest
from langchain_core.documents import Document

import memlane
from memlane.integrations.langchain import MemlaneRetriever
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread

PARTS = {
    "keyword_rank",
    "keyword_score",
    "vector_rank",
    "vector_similarity",
    "fused",
    "recency",
    "usage",
    "importance",
    "final",
}


@pytest.fixture()
def memories(client: memlane.Client) -> tuple[str, dict[str, str]]:
    user = f"u-{uuid.uuid4().hex[:8]}"
    ids: dict[str, str] = {}
    for key, content, kind in [
        ("city", "Dana lives in Lisbon, in the Alfama district", mpb.MEMORY_KIND_FACT),
        ("job", "Dana works as a marine biologist", mpb.MEMORY_KIND_FACT),
        ("units", "Dana prefers metric units", mpb.MEMORY_KIND_PREFERENCE),
    ]:
        r = client.create_memory(caller=mpb.Caller(user_id=user), kind=kind, content=content)
        ids[key] = r.memory.memory_id
    private = client.create_memory(
        caller=mpb.Caller(user_id=user, agent_id="bot-a"),
        kind=mpb.MEMORY_KIND_EPISODIC,
        scope=mpb.MEMORY_SCOPE_AGENT,
        content="bot-a booked Dana a table in Lisbon",
    )
    ids["private"] = private.memory.memory_id
    return user, ids


def test_documents_follow_search_memories(
    server: SidecarThread, client: memlane.Client, memories: tuple[str, dict[str, str]]
) -> None:
    user, ids = memories
    retriever = MemlaneRetriever(target=server.target, user_id=user, k=3)
    docs = retriever.invoke("Where does Dana live?")
    expected = client.search_memories(caller=mpb.Caller(user_id=user), query="Where does Dana live?", limit=3)
    assert [d.id for d in docs] == [h.memory.memory_id for h in expected.results]
    assert docs[0].id == ids["city"] and docs[0].page_content.startswith("Dana lives in Lisbon")
    top = docs[0].metadata
    assert set(top["score_parts"]) == PARTS
    assert top["score"] == pytest.approx(expected.results[0].score)
    assert top["score_parts"]["final"] == pytest.approx(expected.results[0].parts.final)
    assert top["score_parts"]["keyword_rank"] >= 1 and top["score_parts"]["vector_similarity"] > 0
    assert top["kind"] == "MEMORY_KIND_FACT" and top["memory_id"] == ids["city"] and top["user_id"] == user


def test_filters_limit_and_visibility(server: SidecarThread, memories: tuple[str, dict[str, str]]) -> None:
    user, ids = memories
    prefs = MemlaneRetriever(target=server.target, user_id=user, kinds=[mpb.MEMORY_KIND_PREFERENCE])
    assert [d.id for d in prefs.invoke("units")] == [ids["units"]]
    assert len(MemlaneRetriever(target=server.target, user_id=user, k=1).invoke("Dana")) == 1
    # The agent-private memory: its own agent recalls it (positive control), another agent never does.
    owner = MemlaneRetriever(target=server.target, user_id=user, agent_id="bot-a", k=10)
    other = MemlaneRetriever(target=server.target, user_id=user, agent_id="bot-b", k=10)
    assert ids["private"] in [d.id for d in owner.invoke("table booked in Lisbon")]
    seen = [d.id for d in other.invoke("table booked in Lisbon")]
    assert ids["city"] in seen and ids["private"] not in seen


async def test_async_invoke(server: SidecarThread, memories: tuple[str, dict[str, str]]) -> None:
    user, ids = memories
    retriever = MemlaneRetriever(target=server.target, user_id=user, k=2)
    docs = await retriever.ainvoke("What is Dana's job?")
    assert isinstance(docs[0], Document) and docs[0].id == ids["job"]
    # The same documents as the sync path (scores move a little between calls: recency and usage).
    again = retriever.invoke("What is Dana's job?")
    assert [(d.id, d.page_content) for d in docs] == [(d.id, d.page_content) for d in again]


def test_a_retriever_with_an_empty_user_is_refused_precisely(server: SidecarThread) -> None:
    with pytest.raises(memlane.InvalidArgumentError):
        MemlaneRetriever(target=server.target, user_id="").invoke("anything")
