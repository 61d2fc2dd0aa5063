"""``memlane mcp`` through the MCP SDK's own client, over stdio and streamable HTTP, against a real sidecar:
the tools and their schemas, a remembered fact found by search, a conversation's context, the
sidecar's errors as tool errors with their reason, and whom the tools act for (a one-user server
never lets the model name another user; the sidecar's tokens and user binding still decide)."""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

import memlane
import memlane.mcp
from memlane import MemoryKind
from memlane_server.background import SidecarThread
from tests.access_policy import TOKENS, write_policy
from tests.conftest import ServerFactory, wait_for

TOOLS = {
    "add_messages",
    "get_context",
    "search_memories",
    "remember",
    "forget_memory",
    "list_memories",
    "get_profile",
}


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MEMLANE_TOKEN", "MEMLANE_USER_TOKEN")}
    return {**env, "PYTHONPATH": os.pathsep.join(sys.path), **(extra or {})}


@contextlib.asynccontextmanager
async def stdio(
    target: str, *flags: str, env: dict[str, str] | None = None, module: str = "memlane.mcp"
) -> AsyncIterator[ClientSession]:
    """An initialized MCP session with ``python -m <module> --target <target> <flags>`` over stdio."""
    cmd = ["-m", module, *(["mcp"] if module == "memlane_server.cli" else []), "--target", target, *flags]
    params = StdioServerParameters(command=sys.executable, args=cmd, env=_env(env))
    with tempfile.TemporaryFile("w+") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


async def ok(session: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    """The structured result of a tool call that must succeed."""
    result = await session.call_tool(tool, args)
    assert not result.isError, text(result)
    assert result.structuredContent is not None
    return result.structuredContent


async def refused(session: ClientSession, tool: str, **args: Any) -> CallToolResult:
    result = await session.call_tool(tool, args)
    assert result.isError, f"{tool}({args}) was not refused: {text(result)}"
    return result


def error_of(result: CallToolResult) -> dict[str, Any]:
    assert result.structuredContent is not None, text(result)
    error: dict[str, Any] = result.structuredContent["error"]
    return error


def new_user() -> str:
    return f"u-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------- stdio


async def test_lists_the_tools_and_finds_a_remembered_fact(server: SidecarThread) -> None:
    """The issue's done-when: `memlane mcp --target ADDR` over stdio lists the tools to the official
    client, and a remembered fact is found through search_memories."""
    user = new_user()
    async with stdio(server.target, "--user", user, module="memlane_server.cli") as s:
        tools = (await s.list_tools()).tools
        assert {t.name for t in tools} == TOOLS
        for t in tools:
            assert t.description and len(t.description) > 40, t.name
            # One-user server: no tool takes a user, and unknown arguments are refused, not ignored.
            assert "user_id" not in t.inputSchema.get("properties", {}), t.name
            assert t.inputSchema.get("additionalProperties") is False, t.name
        search = next(t for t in tools if t.name == "search_memories").inputSchema
        assert search["required"] == ["query"] and search["properties"]["query"]["description"]

        stored = await ok(s, "remember", content="Keeps a sourdough starter named Clint.", kind="fact")
        assert stored["outcome"] == "created"
        found = await ok(s, "search_memories", query="what is the name of the sourdough starter?")
        assert [m["memory_id"] for m in found["memories"]][:1] == [stored["memory_id"]]
        assert found["memories"][0]["content"] == "Keeps a sourdough starter named Clint."
        result = await s.call_tool("search_memories", {"query": "sourdough starter"})
        assert "Clint" in text(result)  # the text form a model reads

    with memlane.Client(server.target) as c:  # stored for that user, through the sidecar
        got = c.get_memory(caller=memlane.Caller(user_id=user), memory_id=stored["memory_id"]).memory
        assert (got.user_id, got.agent_id, got.kind) == (user, "mcp", MemoryKind.MEMORY_KIND_FACT)


async def test_a_conversation_its_context_profile_and_forgetting(server: SidecarThread) -> None:
    user, sid = new_user(), f"chat-{uuid.uuid4().hex[:8]}"
    async with stdio(server.target, "--user", user, "--agent", "desk-bot") as s:
        added = await ok(
            s,
            "add_messages",
            session_id=sid,
            messages=[
                {"role": "user", "content": "My parcel 5521 arrived with a cracked screen."},
                {"role": "assistant", "content": "Sorry to hear that, I have opened a claim."},
            ],
        )
        assert [r["seq"] for r in added["results"]] == [1, 2]
        again = await ok(s, "add_messages", session_id=sid, messages=[{"role": "user", "content": "Thanks!"}])
        assert [r["seq"] for r in again["results"]] == [3]  # same session, created once

        pref = await ok(s, "remember", content="Prefers replies in French.", kind="preference")
        context = await ok(s, "get_context", session_id=sid, user_input="what about my parcel?")
        assert "parcel 5521" in context["text"] and "Prefers replies in French." in context["text"]
        assert {"role": "user", "content": "My parcel 5521 arrived with a cracked screen."} in context[
            "messages"
        ]
        assert context["messages"][-1] == {"role": "user", "content": "Thanks!"}
        assert context["total_tokens"] > 0

        profile = await ok(s, "get_profile")
        assert [m["memory_id"] for m in profile["preferences"]] == [pref["memory_id"]]
        listed = await ok(s, "list_memories", kinds=["preference"])
        assert [m["memory_id"] for m in listed["memories"]] == [pref["memory_id"]] and listed["total"] == 1

        assert (await ok(s, "forget_memory", memory_id=pref["memory_id"]))["deleted"] == pref["memory_id"]
        assert (await ok(s, "list_memories"))["memories"] == []

    with memlane.Client(server.target) as c:
        session = c.get_session(session_id=sid).session
        assert (session.user_id, session.agent_id, session.channel) == (user, "desk-bot", "mcp")
        with pytest.raises(memlane.NotFoundError):
            c.get_memory(caller=memlane.Caller(user_id=user), memory_id=pref["memory_id"])


async def test_errors_are_tool_errors_with_the_sidecars_reason(server: SidecarThread) -> None:
    async with stdio(server.target, "--user", new_user()) as s:
        bad_id = error_of(await refused(s, "forget_memory", memory_id="{not-an-id}"))
        assert (bad_id["code"], bad_id["reason"], bad_id["field"]) == (
            "INVALID_ARGUMENT",
            "INVALID_ID",
            "memory_id",
        )
        result = await refused(
            s, "add_messages", session_id="a/b", messages=[{"role": "user", "content": "x"}]
        )
        assert "INVALID_ARGUMENT (INVALID_ID, field session_id)" in text(result)
        missing = error_of(await refused(s, "forget_memory", memory_id=f"m-{uuid.uuid4().hex}"))
        assert missing["code"] == "NOT_FOUND"
        # The schema's own bounds are checked before the sidecar is asked.
        assert "validation" in text(await refused(s, "search_memories", query="x", limit=1000)).lower()
        assert "validation" in text(await refused(s, "remember", content="x", kind="secret")).lower()
        # Positive control: the same tools with good input.
        assert (await ok(s, "search_memories", query="x", limit=5))["memories"] == []


# ------------------------------------------------------------------------------------------- identity


async def test_a_one_user_server_never_acts_for_another_user(server: SidecarThread) -> None:
    alice, bob = new_user(), new_user()
    bob_sid, alice_sid = f"bob-{uuid.uuid4().hex[:8]}", f"alice-{uuid.uuid4().hex[:8]}"
    with memlane.Memlane(server.target, agent_id="mcp") as m:
        bob_memory = m.remember(bob, "Bob's locker code is 4431.")
        m.add(bob, bob_sid, [{"role": "user", "content": "bob's secret plan"}])

    async with stdio(server.target, "--user", alice) as s:
        await ok(s, "remember", content="Alice's locker is number 12.")
        # The model names bob: refused by the schema (no such argument), not silently ignored.
        named = await refused(s, "search_memories", query="locker code", user_id=bob)
        assert "user_id" in text(named)
        # Positive control: the same search without the argument answers, with alice's memory only.
        found = await ok(s, "search_memories", query="locker code")
        assert [x["content"] for x in found["memories"]] == ["Alice's locker is number 12."]
        assert "4431" not in str(await ok(s, "list_memories")) + str(await ok(s, "get_profile"))

        # Bob's session: its context is not served, nor can turns be slipped into it.
        hidden = error_of(await refused(s, "get_context", session_id=bob_sid))
        assert (hidden["code"], hidden["reason"]) == ("NOT_FOUND", "SESSION_NOT_FOUND")
        taken = error_of(
            await refused(s, "add_messages", session_id=bob_sid, messages=[{"role": "user", "content": "hi"}])
        )
        assert taken["code"] == "ALREADY_EXISTS"
        assert error_of(await refused(s, "forget_memory", memory_id=bob_memory))["code"] == "NOT_FOUND"
        # Positive control: alice's own session, through the same tools.
        await ok(s, "add_messages", session_id=alice_sid, messages=[{"role": "user", "content": "hello"}])
        assert "hello" in (await ok(s, "get_context", session_id=alice_sid))["text"]

    with memlane.Client(server.target) as c:  # bob's data is as he left it
        assert [x.content for x in c.list_messages(session_id=bob_sid).messages] == ["bob's secret plan"]
        assert c.get_memory(caller=memlane.Caller(user_id=bob), memory_id=bob_memory).memory.content


async def test_any_user_mode_makes_the_user_an_argument(server: SidecarThread) -> None:
    alice, bob = new_user(), new_user()
    async with stdio(server.target, "--any-user") as s:
        for t in (await s.list_tools()).tools:
            assert "user_id" in t.inputSchema["required"], t.name
        assert "user_id" in text(await refused(s, "search_memories", query="tea"))
        await ok(s, "remember", user_id=alice, content="Drinks green tea every morning.")
        assert len((await ok(s, "search_memories", user_id=alice, query="tea"))["memories"]) == 1
        assert (await ok(s, "search_memories", user_id=bob, query="tea"))["memories"] == []


def test_the_public_face_is_small() -> None:
    assert sorted(memlane.mcp.__all__) == [
        "McpOptions",
        "OptionsError",
        "add_arguments",
        "main",
        "run",
        "serve",
    ]


def test_flags_that_leave_the_user_open_or_the_endpoint_exposed_are_refused(server: SidecarThread) -> None:
    def start(*flags: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "memlane.mcp", "--target", server.target, *flags]
        return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=60, check=False)

    neither = start()
    assert neither.returncode == 2 and "--user" in neither.stderr
    both = start("--user", "alice", "--any-user")
    assert both.returncode == 2
    exposed = start("--user", "alice", "--transport", "http", "--listen", "0.0.0.0:0")
    assert exposed.returncode == 2 and "--allow-remote" in exposed.stderr


# ------------------------------------------------------------------------ the sidecar's rules still hold

KEY = Ed25519PrivateKey.generate()
ISSUER, AUDIENCE = "https://login.example", "memlane"


def _user_token(sub: str) -> str:
    now = int(time.time())
    claims = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600}
    return jwt.encode(claims, KEY, algorithm="EdDSA", headers={"kid": "k1"})


@pytest.fixture(scope="module")
def bound(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> SidecarThread:
    raw = KEY.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    jwk = {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": base64.urlsafe_b64encode(raw).rstrip(b"=").decode(),
        "kid": "k1",
    }
    policy = write_policy(
        tmp_path_factory.mktemp("mcp-policy") / "policy.yaml", user_token_jwks={"keys": [jwk]}
    )
    return start_server(
        auth_required=True,
        access_policy_file=str(policy),
        user_token_required=True,
        user_token_issuer=ISSUER,
        user_token_audience=AUDIENCE,
    )


async def test_the_sidecars_tokens_and_user_binding_decide(bound: SidecarThread) -> None:
    alice, bob = new_user(), new_user()
    async with stdio(bound.target, "--user", alice) as s:  # no token at all
        assert error_of(await refused(s, "list_memories"))["code"] == "UNAUTHENTICATED"
    # --any-user with alice's end-user token: the model may name bob, and the sidecar refuses it.
    env = {"MEMLANE_TOKEN": TOKENS["writer"], "MEMLANE_USER_TOKEN": _user_token(alice)}
    async with stdio(bound.target, "--any-user", "--agent", "writer", env=env) as s:
        assert error_of(await refused(s, "remember", user_id=bob, content="Bob hates mondays."))["code"] == (
            "PERMISSION_DENIED"
        )
        stored = await ok(s, "remember", user_id=alice, content="Alice collects stamps.")  # positive control
        found = await ok(s, "search_memories", user_id=alice, query="stamps")
        assert [m["memory_id"] for m in found["memories"]] == [stored["memory_id"]]


# ----------------------------------------------------------------------------------------------- HTTP


@contextlib.contextmanager
def http_server(target: str, *flags: str) -> Iterator[str]:
    """``memlane mcp --transport http`` on a free loopback port; yields its URL."""
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "stderr"
        cmd = [sys.executable, "-m", "memlane_server.cli", "mcp", "--target", target, "--transport", "http"]
        with log.open("w") as err:
            proc = subprocess.Popen([*cmd, "--listen", "127.0.0.1:0", *flags], env=_env(), stderr=err)
        try:
            line = wait_for(
                lambda: next((x for x in log.read_text().splitlines() if "listening on" in x), ""),
                timeout=60,
                describe=log.read_text,
            )
            yield line.rsplit(" ", 1)[-1]
        finally:
            proc.terminate()
            proc.wait(timeout=30)


async def test_streamable_http(server: SidecarThread) -> None:
    user = new_user()
    with http_server(server.target, "--user", user) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
        async with streamable_http_client(url) as (read, write, _), ClientSession(read, write) as s:
            await s.initialize()
            assert {t.name for t in (await s.list_tools()).tools} == TOOLS
            stored = await ok(s, "remember", content="Rides a red tandem bicycle on weekends.")
            found = await ok(s, "search_memories", query="what bicycle does the user ride?")
            assert [m["memory_id"] for m in found["memories"]][:1] == [stored["memory_id"]]
            assert "user_id" in text(await refused(s, "search_memories", query="bicycle", user_id="someone"))
        # DNS rebinding: a page served from another name that resolves here is refused by Host.
        body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        headers = {"accept": "application/json, text/event-stream"}
        async with httpx.AsyncClient() as h:
            rebound = await h.post(url, json=body, headers={**headers, "host": "evil.example:80"})
            assert rebound.status_code == 421
            evil_origin = await h.post(url, json=body, headers={**headers, "origin": "http://evil.example"})
            assert evil_origin.status_code == 403
