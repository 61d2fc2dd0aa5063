"""The client's retry policy against a real gRPC peer that answers UNAVAILABLE: writes it can make safe
(a client-chosen id) are retried with the same id; writes it cannot are sent once."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

import memlane
from memlane.v1 import memory_pb2 as mpb

RETRY = memlane.RetryPolicy(max_attempts=4, initial_backoff=0.001, max_backoff=0.002)


class _Unavailable:
    """Serves MemoryService; every call is recorded, then refused with UNAVAILABLE."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def handler(self, name: str, request_type: Any) -> grpc.RpcMethodHandler:
        def answer(request: Any, context: grpc.ServicerContext) -> Any:
            self.calls.append((name, request))
            context.abort(grpc.StatusCode.UNAVAILABLE, "peer is down")

        return grpc.unary_unary_rpc_method_handler(
            answer, request_deserializer=request_type.FromString, response_serializer=lambda r: b""
        )


@pytest.fixture()
def peer() -> Iterator[tuple[_Unavailable, str]]:
    peer = _Unavailable()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handlers = {
        "RecordFeedback": peer.handler("RecordFeedback", mpb.RecordFeedbackRequest),
        "CreateMemory": peer.handler("CreateMemory", mpb.CreateMemoryRequest),
        "ExtractMemories": peer.handler("ExtractMemories", mpb.ExtractMemoriesRequest),
        "GetMemory": peer.handler("GetMemory", mpb.GetMemoryRequest),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("memlane.v1.MemoryService", handlers),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield peer, f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def _attempts(peer: _Unavailable, name: str) -> list[Any]:
    return [r for n, r in peer.calls if n == name]


def test_only_writes_safe_to_repeat_are_retried(peer: tuple[_Unavailable, str]) -> None:
    fake, target = peer
    caller = mpb.Caller(user_id="u1")
    with memlane.Client(target, timeout=5, retry=RETRY) as c:
        # Control: a read is retried up to the policy's attempts.
        with pytest.raises(memlane.UnavailableError):
            c.get_memory(caller=caller, memory_id="m")
        assert len(_attempts(fake, "GetMemory")) == 4
        # Feedback: retried, every attempt with the same client-chosen feedback id.
        with pytest.raises(memlane.UnavailableError):
            c.record_feedback(caller=caller, memory_id="m", verdict=mpb.FEEDBACK_VERDICT_USEFUL)
        ids = {r.feedback_id for r in _attempts(fake, "RecordFeedback")}
        assert len(_attempts(fake, "RecordFeedback")) == 4 and len(ids) == 1 and ids != {""}
        # CreateMemory: once without a memory id, retried with one.
        with pytest.raises(memlane.UnavailableError):
            c.create_memory(caller=caller, content="User rows.")
        assert len(_attempts(fake, "CreateMemory")) == 1
        with pytest.raises(memlane.UnavailableError):
            c.create_memory(caller=caller, content="User rows.", memory_id="mem-1")
        assert len(_attempts(fake, "CreateMemory")) == 5
        # ExtractMemories: once when it stores, retried when it is a dry run.
        msg = mpb.ExtractMemoriesRequest(caller=caller)
        msg.messages.add(role=1, content="I row.")
        with pytest.raises(memlane.UnavailableError):
            c.extract_memories(msg)
        assert len(_attempts(fake, "ExtractMemories")) == 1
        msg.dry_run = True
        with pytest.raises(memlane.UnavailableError):
            c.extract_memories(msg)
        assert len(_attempts(fake, "ExtractMemories")) == 5
