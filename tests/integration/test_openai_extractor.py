"""The OpenAI-compatible extractor, through the real server, against a local peer that speaks the
chat-completions protocol: what it sends (strict JSON schema, temperature 0, bearer key), and that the
model's answer goes through the same screen as the rules (PII, greetings, provenance) whatever it says."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

import memlane
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import session_pb2 as spb
from memlane_server.background import SidecarThread
from tests.conftest import ServerFactory
from tests.peers.openai_compat import LoggedRequest, OpenAICompatServer, Reply


def _answer(req: LoggedRequest) -> Reply:
    memories = [
        # Kept: a real fact with provenance in a user turn.
        {"kind": "fact", "content": "User lives in Porto.", "keywords": ["Porto"], "slot": "location",
         "importance": 0.8, "source_message_ids": ["u1"]},
        # Rejected: personal data, whatever the model thinks.
        {"kind": "fact", "content": "User's email is ana.silva@example.com.", "keywords": [], "slot": "",
         "importance": 0.5, "source_message_ids": ["u1"]},
        # Rejected: a greeting is not a memory.
        {"kind": "fact", "content": "Hello there!", "keywords": [], "slot": "", "importance": 0.1,
         "source_message_ids": ["u1"]},
        # Rejected: cites the assistant's turn, not the user's words.
        {"kind": "preference", "content": "User prefers window seats.", "keywords": [], "slot": "",
         "importance": 0.5, "source_message_ids": ["a1"]},
    ]  # fmt: skip
    return Reply(content=json.dumps({"memories": memories}), prompt_tokens=321, completion_tokens=45)


@pytest.fixture(scope="module")
def peer() -> Iterator[OpenAICompatServer]:
    with OpenAICompatServer(api_key="sk-test", responder=_answer) as srv:
        yield srv


@pytest.fixture(scope="module")
def sidecar(start_server: ServerFactory, peer: OpenAICompatServer) -> SidecarThread:
    return start_server(
        extractor="openai",
        extractor_base_url=peer.base_url,
        extractor_model="gpt-4o-mini",
        extractor_api_key="sk-test",
    )


def test_openai_extractor_is_screened_like_the_rules(
    sidecar: SidecarThread, peer: OpenAICompatServer
) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    with memlane.Client(sidecar.target, timeout=30) as c:
        out = c.extract_memories(
            caller=mpb.Caller(user_id=user),
            session_id="s1",
            messages=[
                spb.Message(message_id="u1", role=spb.ROLE_USER, content="Hi! I moved to Porto last month."),
                spb.Message(message_id="a1", role=spb.ROLE_ASSISTANT, content="Window seat again?"),
            ],
        )
        kept = [m.memory.content for m in out.memories]
        assert kept == ["User lives in Porto."]
        stored = c.list_memories(caller=mpb.Caller(user_id=user)).memories
        assert [m.content for m in stored] == ["User lives in Porto."]
        assert list(stored[0].source_message_ids) == ["u1"]

    sent = peer.requests[-1]
    assert sent.path.endswith("/chat/completions")
    assert sent.headers.get("authorization") == "Bearer sk-test"
    assert sent.body["model"] == "gpt-4o-mini" and sent.body["temperature"] == 0
    schema = sent.body["response_format"]
    assert schema["type"] == "json_schema" and schema["json_schema"]["strict"] is True
    assert "[u1]" in sent.prompt_text and "Porto" in sent.prompt_text

    metrics = sidecar.sidecar.registry
    assert metrics.get_sample_value("memlane_extraction_tokens_in_total", {"provider": "openai"}) == 321
    assert metrics.get_sample_value("memlane_extraction_tokens_out_total", {"provider": "openai"}) == 45
    rejected = metrics.get_sample_value(
        "memlane_extraction_memories_total", {"provider": "openai", "fate": "rejected_pii"}
    )
    assert rejected == 1


def test_a_failing_provider_is_unavailable_not_internal(
    sidecar: SidecarThread, peer: OpenAICompatServer
) -> None:
    peer.responder = lambda req: Reply(status=503)
    try:
        with (
            memlane.Client(sidecar.target, timeout=30, retry=memlane.NO_RETRY) as c,
            pytest.raises(memlane.UnavailableError, match="extraction provider failed: HTTP 503"),
        ):
            c.extract_memories(
                caller=mpb.Caller(user_id="u-x"),
                session_id="s2",
                messages=[spb.Message(message_id="u1", role=spb.ROLE_USER, content="I live in Faro.")],
            )
    finally:
        peer.responder = _answer
