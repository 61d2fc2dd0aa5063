"""The public face of the client: what `import memlane` offers, and one method per RPC on both clients."""

from __future__ import annotations

import asyncio
import inspect
import re
import runpy
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import memlane
from memlane.v1 import admin_pb2, checkpoint_pb2, context_pb2, memory_pb2, procedure_pb2, session_service_pb2

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = {
    "DEFAULT_TARGET", "NO_RETRY", "AbortedError", "AlreadyExistsError", "AsyncClient", "CancelledError",
    "Client", "DataLossError", "DeadlineExceededError", "FailedPreconditionError", "InternalError",
    "InvalidArgumentError", "MemlaneError", "Message", "MessageOrder", "NativeMessage", "NotFoundError",
    "OutOfRangeError", "PermissionDeniedError", "PromotionState", "ResourceExhaustedError", "RetryPolicy",
    "Role", "Session", "SessionStatus", "Summary", "Topology", "UnauthenticatedError", "UnavailableError",
    "UnimplementedError", "UnknownError", "VisibilityKind", "iter_pages", "new_id",
    # where a command line finds the sidecar ($MEMLANE_ADDRESS): the server's CLI and the MCP server's
    "address_from_env",
    # grouping bases of the errors, and the field at fault
    "ClientError", "RetryableError", "ServerError", "FieldViolation",
    # the high-level layer and the types a developer meets first
    "AppendResult", "AssembleStats", "AsyncMemlane", "Caller", "ChatMessage", "ContextBlock",
    "ContextMessage", "ContextSection", "ContextStrategy", "ExportFormat", "FeedbackVerdict",
    "HistoryFallback", "IngestOutcome", "Memlane", "Memory", "MemoryFilter", "MemoryKind", "MemoryRef",
    "MemoryScope", "Provenance", "ScoreParts", "ScoredMemory", "SearchMode", "TurnTrace",
    # what the high-level history() returns (issue 47: the whole lifecycle on Memlane)
    "MemoryChangeReason", "MemoryVersion",
}  # fmt: skip


def test_public_names_are_pinned() -> None:
    assert set(memlane.__all__) == EXPECTED
    assert all(hasattr(memlane, name) for name in memlane.__all__)


def _rpcs() -> list[tuple[str, bool]]:
    out = []
    for module in (session_service_pb2, context_pb2, memory_pb2, admin_pb2, checkpoint_pb2, procedure_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                out.append((re.sub(r"(?<!^)(?=[A-Z])", "_", m.name).lower(), m.server_streaming))
    return out


# Nothing listens on port 1: every call fails fast with UNAVAILABLE, which proves the method reached
# the transport with the right shape (unary: one response; streaming: an iterator of them).
DEAD = "127.0.0.1:1"


@pytest.mark.parametrize(("name", "streaming"), _rpcs())
def test_every_rpc_has_a_method_on_both_clients(name: str, streaming: bool) -> None:
    kind = type(memlane.Client.__dict__.get(name) or getattr(memlane.Client, name)).__name__
    assert kind == ("_Stream" if streaming else "_Unary")
    assert type(getattr(memlane.AsyncClient, name)).__name__ == kind
    with (
        memlane.Client(DEAD, retry=memlane.NO_RETRY, timeout=5) as sync,
        pytest.raises(memlane.UnavailableError),
    ):
        result = getattr(sync, name)()
        if streaming:
            assert isinstance(result, Iterator)
            next(result)
    asyncio.run(_check_async(name, streaming))


async def _check_async(name: str, streaming: bool) -> None:
    async with memlane.AsyncClient(DEAD, retry=memlane.NO_RETRY, timeout=5) as aio:
        result = getattr(aio, name)()
        with pytest.raises(memlane.UnavailableError):
            if streaming:
                assert isinstance(result, AsyncIterator)
                await anext(result)
            else:
                assert inspect.isawaitable(result)
                await result


def test_every_error_class_is_a_memlane_error() -> None:
    for name in EXPECTED:
        obj = getattr(memlane, name)
        if inspect.isclass(obj) and name.endswith("Error"):
            assert issubclass(obj, memlane.MemlaneError)


# mem0's Memory lifecycle (get_all, not list: mem0's name) and a conversation's: the same in TypeScript
# (clients/typescript/test/memlane.test.ts pins that surface in camelCase).
HIGH_LEVEL = {
    "add", "context", "search", "remember", "get", "get_all", "update", "delete", "history",
    "close_session", "forget_user", "close",
}  # fmt: skip


def test_high_level_clients_share_one_surface() -> None:
    def public(cls: type) -> set[str]:
        return {n for n in vars(cls) if not n.startswith("_")}

    assert public(memlane.Memlane) == public(memlane.AsyncMemlane) == HIGH_LEVEL
    for name in HIGH_LEVEL - {"close"}:
        sync = inspect.signature(getattr(memlane.Memlane, name))
        aio = inspect.signature(getattr(memlane.AsyncMemlane, name))
        assert sync.parameters == aio.parameters, name
        assert inspect.iscoroutinefunction(getattr(memlane.AsyncMemlane, name))


def test_version_is_exposed() -> None:
    assert memlane.__version__ and memlane.__version__[0].isdigit()


def test_typed_rpc_surface_is_current() -> None:
    gen = runpy.run_path(str(ROOT / "scripts" / "gen_client_types.py"))
    assert (ROOT / "client_py" / "memlane" / "v1" / "rpcs.pyi").read_text() == gen["render"](), (
        "run scripts/gen-protos (or scripts/gen_client_types.py) and commit client_py/memlane/v1/rpcs.pyi"
    )


def test_mypy_catches_a_misspelt_or_mistyped_field(tmp_path: Path) -> None:
    mypy_api = pytest.importorskip("mypy.api")
    good = (
        "import memlane\n"
        "async def f(c: memlane.Client, a: memlane.AsyncClient) -> None:\n"
        "    s = c.create_session(user_id='u', topology=memlane.Topology.TOPOLOGY_SHARED).session\n"
        "    await a.append_messages(session_id=s.session_id, messages=[memlane.Message(content='hi')])\n"
    )
    bad = good.replace("user_id='u'", "usr_id='u'").replace("content='hi')]", "content='hi')], page=3")
    out = []
    for name, code in (("good", good), ("bad", bad)):
        path = tmp_path / f"{name}.py"
        path.write_text(code)
        stdout, _, status = mypy_api.run(
            [
                "--strict",
                "--cache-dir",
                str(tmp_path / "cache"),
                "--config-file",
                str(ROOT / "pyproject.toml"),
                str(path),
            ]
        )
        out.append((status, stdout))
    assert out[0][0] == 0, out[0][1]  # the correct call type-checks
    assert out[1][0] == 1
    assert 'Unexpected keyword argument "usr_id"' in out[1][1]
    assert 'Unexpected keyword argument "page"' in out[1][1]
