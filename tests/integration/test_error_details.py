"""Errors carry structured details (google.rpc BadRequest / ErrorInfo / RetryInfo) that both clients
expose as ``field``, ``reason``, ``retry_after``; a server sending hostile details cannot break them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from google.rpc.status_pb2 import Status

import memlane
from memlane_server.api.interceptor import DETAILS_KEY, trailer
from memlane_server.background import SidecarThread


def test_sync_and_async_clients_expose_field_and_reason(server: SidecarThread, user_id: str) -> None:
    with memlane.Client(server.target, timeout=10) as c:
        sid = c.create_session(user_id=user_id).session.session_id
        assert c.get_session(session_id=sid).session.session_id == sid  # positive control
        with pytest.raises(memlane.InvalidArgumentError) as bad:
            c.get_session(session_id="a{b}")
        with pytest.raises(memlane.NotFoundError) as missing:
            c.get_session(session_id="nope-404")
    assert (bad.value.reason, bad.value.field) == ("INVALID_ID", "session_id")
    assert isinstance(bad.value, memlane.ClientError) and not bad.value.retryable
    assert missing.value.reason == "NOT_FOUND" and missing.value.field == ""

    async def run() -> memlane.MemlaneError:
        async with memlane.AsyncClient(server.target, timeout=10) as ac:
            try:
                await ac.create_session(user_id="")
            except memlane.MemlaneError as exc:
                return exc
        raise AssertionError("an empty user_id was accepted")

    exc = asyncio.run(run())
    assert isinstance(exc, memlane.InvalidArgumentError)
    assert (exc.reason, exc.field) == ("REQUIRED", "user_id")


class _Hostile(grpc.GenericRpcHandler):
    """A server that answers GetSession with whatever trailer the test gives it."""

    def __init__(self) -> None:
        self.trailer: tuple[tuple[str, Any], ...] = ()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        def abort(request: bytes, context: grpc.ServicerContext) -> bytes:
            context.abort_with_status(_StatusWith(self.trailer))
            return b""

        return grpc.unary_unary_rpc_method_handler(abort)


class _StatusWith(grpc.Status):
    def __init__(self, trailing: tuple[tuple[str, Any], ...]) -> None:
        self.code = grpc.StatusCode.NOT_FOUND
        self.details = "hostile"
        self.trailing_metadata = trailing


@pytest.fixture(scope="module")
def hostile() -> Iterator[tuple[str, _Hostile]]:
    handler = _Hostile()
    srv = grpc.server(ThreadPoolExecutor(2), handlers=[handler])
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield f"127.0.0.1:{port}", handler
    srv.stop(None)


def _garbage_status() -> bytes:
    status = Status(code=5, message="x")
    any_detail = status.details.add()
    any_detail.type_url = "type.googleapis.com/google.rpc.ErrorInfo"
    any_detail.value = b"\xff\xff\xff"  # not a valid ErrorInfo
    return status.SerializeToString()


@pytest.mark.parametrize(
    "details",
    [b"\x00\xff not a status", b"", _garbage_status(), b"\n" * 1000],
)
def test_hostile_details_give_a_plain_typed_error(hostile: tuple[str, _Hostile], details: bytes) -> None:
    target, handler = hostile
    handler.trailer = ((DETAILS_KEY, details),)
    with (
        memlane.Client(target, timeout=5, retry=memlane.NO_RETRY) as c,
        pytest.raises(memlane.NotFoundError) as e,
    ):
        c.get_session(session_id="s")
    assert e.value.message == "hostile" and e.value.field == ""


def test_well_formed_details_from_any_server_are_read(hostile: tuple[str, _Hostile]) -> None:
    """Positive control for the test above: the same server path with valid details."""
    target, handler = hostile
    handler.trailer = trailer(
        grpc.StatusCode.NOT_FOUND, "hostile", "SOME_REASON", field="a.b", retry_after_ms=1500
    )
    with (
        memlane.Client(target, timeout=5, retry=memlane.NO_RETRY) as c,
        pytest.raises(memlane.NotFoundError) as e,
    ):
        c.get_session(session_id="s")
    assert (e.value.reason, e.value.field, e.value.retry_after) == ("SOME_REASON", "a.b", 1.5)
