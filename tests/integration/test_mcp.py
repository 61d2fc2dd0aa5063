"""``memlane mcp`` through the MCP SDK's own client, over stdio and streamable HTTP, against a real sidecar:
the tools and their schemas, a remembered fact found by search, a conversation's context, the
sidecar's errors as tool errors with their reason, and whom the tools act for (a one-user server
never lets the model name another user; the sidecar's tokens and user binding still decide)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import jsonschema  # type: ignore[import-untyped]
import jwt
import mcp.shared.exceptions as mcp_errors
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

import memlane
import memlane.mcp
from memlane import MemoryKind
from memlane.mcp._server import INVALID_PARAMS, RESOURCE_NOT_FOUND
from memlane.mcp._tools import MAX_MEMORY_CHARS
from memlane_server.background import SidecarThread
from memlane_server.ltm.core import MAX_CONTENT_CHARS
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


# The tests run on both SDK lines (scripts/test-mcp2: 2.x). 2.x names the types' fields in snake_case and
# renamed McpError; both dump MCP's wire form, so every answer is read as that (camelCase, as the spec).
ProtocolError: type[Exception] = getattr(mcp_errors, "MCPError", None) or mcp_errors.McpError


def wire(answer: Any) -> Any:
    """An SDK object as MCP's JSON (the spec's field names), whichever SDK line made it."""
    return answer.model_dump(by_alias=True, mode="json", exclude_none=True)


async def tools_of(session: ClientSession) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in wire(await session.list_tools())["tools"]}


async def read_uri(session: ClientSession, uri: str) -> Any:
    # 1.x types the argument AnyUrl, 2.x str; both validate a str.
    return await session.read_resource(cast(Any, uri))


def text(result: dict[str, Any]) -> str:
    return "\n".join(c["text"] for c in result["content"] if c["type"] == "text")


async def call(session: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    result: dict[str, Any] = wire(await session.call_tool(tool, args))
    return result


async def ok(session: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    """The structured result of a tool call that must succeed."""
    result = await call(session, tool, **args)
    assert not result.get("isError"), text(result)
    structured: dict[str, Any] = result["structuredContent"]
    return structured


async def refused(session: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    result = await call(session, tool, **args)
    assert result.get("isError"), f"{tool}({args}) was not refused: {text(result)}"
    return result


def error_of(result: dict[str, Any]) -> dict[str, Any]:
    assert "structuredContent" in result, text(result)
    error: dict[str, Any] = result["structuredContent"]["error"]
    return error


def new_user() -> str:
    return f"u-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------- stdio


async def test_lists_the_tools_and_finds_a_remembered_fact(server: SidecarThread) -> None:
    """The issue's done-when: `memlane mcp --target ADDR` over stdio lists the tools to the official
    client, and a remembered fact is found through search_memories."""
    user = new_user()
    async with stdio(server.target, "--user", user, module="memlane_server.cli") as s:
        tools = await tools_of(s)
        assert tools.keys() == TOOLS
        for name, t in tools.items():
            assert len(t["description"]) > 40, name
            # One-user server: no tool takes a user, and unknown arguments are refused, not ignored.
            assert "user_id" not in t["inputSchema"].get("properties", {}), name
            assert t["inputSchema"].get("additionalProperties") is False, name
        search = tools["search_memories"]["inputSchema"]
        assert search["required"] == ["query"] and search["properties"]["query"]["description"]

        stored = await ok(s, "remember", content="Keeps a sourdough starter named Clint.", kind="fact")
        assert stored["outcome"] == "created"
        found = await ok(s, "search_memories", query="what is the name of the sourdough starter?")
        assert [m["memory_id"] for m in found["memories"]][:1] == [stored["memory_id"]]
        assert found["memories"][0]["content"] == "Keeps a sourdough starter named Clint."
        result = await call(s, "search_memories", query="sourdough starter")
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
            conversation_id=sid,
            messages=[
                {"role": "user", "content": "My parcel 5521 arrived with a cracked screen."},
                {"role": "assistant", "content": "Sorry to hear that, I have opened a claim."},
            ],
        )
        assert [r["seq"] for r in added["results"]] == [1, 2]
        again = await ok(
            s, "add_messages", conversation_id=sid, messages=[{"role": "user", "content": "Thanks!"}]
        )
        assert [r["seq"] for r in again["results"]] == [3]  # same session, created once

        pref = await ok(s, "remember", content="Prefers replies in French.", kind="preference")
        context = await ok(s, "get_context", conversation_id=sid, user_input="what about my parcel?")
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
            s, "add_messages", conversation_id="a/b", messages=[{"role": "user", "content": "x"}]
        )
        assert "INVALID_ARGUMENT (INVALID_ID, field conversation_id)" in text(result)
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
        hidden = error_of(await refused(s, "get_context", conversation_id=bob_sid))
        assert (hidden["code"], hidden["reason"]) == ("NOT_FOUND", "SESSION_NOT_FOUND")
        taken = error_of(
            await refused(
                s, "add_messages", conversation_id=bob_sid, messages=[{"role": "user", "content": "hi"}]
            )
        )
        assert taken["code"] == "ALREADY_EXISTS"
        assert error_of(await refused(s, "forget_memory", memory_id=bob_memory))["code"] == "NOT_FOUND"
        # Positive control: alice's own session, through the same tools.
        await ok(
            s, "add_messages", conversation_id=alice_sid, messages=[{"role": "user", "content": "hello"}]
        )
        assert "hello" in (await ok(s, "get_context", conversation_id=alice_sid))["text"]

    with memlane.Client(server.target) as c:  # bob's data is as he left it
        assert [x.content for x in c.list_messages(session_id=bob_sid).messages] == ["bob's secret plan"]
        assert c.get_memory(caller=memlane.Caller(user_id=bob), memory_id=bob_memory).memory.content


async def test_any_user_mode_makes_the_user_an_argument(server: SidecarThread) -> None:
    alice, bob = new_user(), new_user()
    async with stdio(server.target, "--any-user") as s:
        for name, t in (await tools_of(s)).items():
            assert "user_id" in t["inputSchema"]["required"], name
        assert "user_id" in text(await refused(s, "search_memories", query="tea"))
        await ok(s, "remember", user_id=alice, content="Drinks green tea every morning.")
        assert len((await ok(s, "search_memories", user_id=alice, query="tea"))["memories"]) == 1
        assert (await ok(s, "search_memories", user_id=bob, query="tea"))["memories"] == []


# ------------------------------------------------------------------ the current spec: metadata, resources

# What each tool declares: (read-only, destructive, idempotent).
HINTS = {
    "add_messages": (False, False, False),
    "get_context": (True, False, True),
    "search_memories": (True, False, True),
    "remember": (False, False, True),
    "forget_memory": (False, True, True),
    "list_memories": (True, False, True),
    "get_profile": (True, False, True),
}


async def test_tools_carry_titles_annotations_and_output_schemas(server: SidecarThread) -> None:
    """Every tool has a title, the three hints and an output schema, and what it returns conforms to
    that schema (checked here, and by the SDK's client on every call_tool)."""
    sid = f"chat-{uuid.uuid4().hex[:8]}"
    async with stdio(server.target, "--user", new_user()) as s:
        tools = await tools_of(s)
        assert tools.keys() == HINTS.keys()
        for name, t in tools.items():
            notes = t["annotations"]
            assert t["title"] and notes["title"] == t["title"], name
            hints = (notes["readOnlyHint"], notes["destructiveHint"], notes["idempotentHint"])
            assert hints == HINTS[name], name
            assert notes["openWorldHint"] is False, name
            assert t["outputSchema"]["type"] == "object", name
        # The docs' word: a conversation, in the fields and the refusals alike.
        assert "conversation_id" in tools["add_messages"]["inputSchema"]["required"]
        assert "session_id" not in str(tools["get_context"]["inputSchema"])

        remembered = await ok(s, "remember", content="Grows chillies on the balcony.", kind="fact")
        results = {
            "add_messages": await ok(
                s, "add_messages", conversation_id=sid, messages=[{"role": "user", "content": "hi"}]
            ),
            "get_context": await ok(s, "get_context", conversation_id=sid, user_input="chillies?"),
            "search_memories": await ok(s, "search_memories", query="chillies"),
            "remember": remembered,
            "list_memories": await ok(s, "list_memories"),
            "get_profile": await ok(s, "get_profile"),
            "forget_memory": await ok(s, "forget_memory", memory_id=remembered["memory_id"]),
        }
        for name, data in results.items():
            jsonschema.validate(data, tools[name]["outputSchema"])
        assert results["add_messages"]["conversation_id"] == sid
        assert results["search_memories"]["memories"][0]["score"] > 0
        missing = error_of(await refused(s, "get_context", conversation_id=f"nope-{uuid.uuid4().hex[:6]}"))
        assert missing["field"] == "conversation_id"


async def test_resources_and_the_recall_prompt(server: SidecarThread) -> None:
    alice, bob = new_user(), new_user()
    sid, bob_sid = f"chat-{uuid.uuid4().hex[:8]}", f"bob-{uuid.uuid4().hex[:8]}"
    with memlane.Memlane(server.target, agent_id="mcp") as m:
        (turn,) = m.add(bob, bob_sid, [{"role": "user", "content": "bob's turn"}])
        m.client.submit_summary(
            session_id=bob_sid,
            text="Bob asked about his locker.",
            through_seq=1,
            through_message_id=turn.message_id,
        )
    async with stdio(server.target, "--user", alice) as s:
        listed = {r["uri"]: r for r in wire(await s.list_resources())["resources"]}
        assert listed.keys() == {"memlane://profile", "memlane://memories"}
        assert all(r["mimeType"] == "application/json" and r["title"] for r in listed.values())
        templates = [t["uriTemplate"] for t in wire(await s.list_resource_templates())["resourceTemplates"]]
        assert templates == ["memlane://conversations/{conversation_id}/summary"]

        pref = await ok(s, "remember", content="Prefers oolong tea to coffee.", kind="preference")
        await ok(s, "remember", content="Has a cat named Pixel.", kind="fact")
        profile = json.loads(await read(s, "memlane://profile"))
        assert [p["memory_id"] for p in profile["preferences"]] == [pref["memory_id"]]
        memories = json.loads(await read(s, "memlane://memories"))
        assert {m["content"] for m in memories["memories"]} == {
            "Prefers oolong tea to coffee.",
            "Has a cat named Pixel.",
        }

        added = await ok(
            s, "add_messages", conversation_id=sid, messages=[{"role": "user", "content": "tea time"}]
        )
        with memlane.Client(server.target) as c:
            c.submit_summary(
                session_id=sid,
                text="Alice talked about tea.",
                through_seq=1,
                through_message_id=added["results"][0]["message_id"],
            )
        summary = json.loads(await read(s, f"memlane://conversations/{sid}/summary"))
        assert (summary["conversation_id"], summary["text"], summary["through_seq"]) == (
            sid,
            "Alice talked about tea.",
            1,
        )
        # Bob's conversation, an unknown URI and a hostile one: refused, and nothing of Bob's comes back.
        for uri, code in (
            (f"memlane://conversations/{bob_sid}/summary", RESOURCE_NOT_FOUND),
            ("memlane://users/bob/profile", RESOURCE_NOT_FOUND),
            ("memlane://conversations/%2F..%2F/summary", INVALID_PARAMS),  # the sidecar's INVALID_ID
            ("file:///etc/passwd", RESOURCE_NOT_FOUND),
        ):
            with pytest.raises(ProtocolError) as refusal:
                await read_uri(s, uri)
            assert refusal.value.error.code == code, uri  # type: ignore[attr-defined]
            assert "locker" not in str(refusal.value), uri

        prompts = wire(await s.list_prompts())["prompts"]
        assert [(p["name"], [a["name"] for a in p["arguments"]]) for p in prompts] == [
            ("recall_user", ["topic"])
        ]
        recalled = await s.get_prompt("recall_user", {"topic": "what does she drink?"})
        (message,) = wire(recalled)["messages"]
        assert message["role"] == "user" and message["content"]["type"] == "text"
        assert "Prefers oolong tea to coffee." in message["content"]["text"]
        assert "Pixel" in wire(await s.get_prompt("recall_user", {}))["messages"][0]["content"]["text"]
        with pytest.raises(ProtocolError):
            await s.get_prompt("recall_user", {"user_id": bob})  # a one-user server takes no user
        with pytest.raises(ProtocolError):
            await s.get_prompt("delete_everything", {})


async def test_any_user_resources_name_the_user(server: SidecarThread) -> None:
    alice = new_user()
    async with stdio(server.target, "--any-user") as s:
        assert wire(await s.list_resources())["resources"] == []
        templates = {t["uriTemplate"] for t in wire(await s.list_resource_templates())["resourceTemplates"]}
        assert templates == {
            "memlane://users/{user_id}/profile",
            "memlane://users/{user_id}/memories",
            "memlane://users/{user_id}/conversations/{conversation_id}/summary",
        }
        await ok(s, "remember", user_id=alice, content="Speaks Portuguese.", kind="fact")
        facts = json.loads(await read(s, f"memlane://users/{alice}/profile"))["facts"]
        assert [f["content"] for f in facts] == ["Speaks Portuguese."]
        with pytest.raises(ProtocolError):
            await read(s, "memlane://profile")  # whose? this server needs the user in the URI
        recalled = wire(await s.get_prompt("recall_user", {"user_id": alice}))["messages"][0]["content"]
        assert "Speaks Portuguese." in recalled["text"]
        with pytest.raises(ProtocolError):
            await s.get_prompt("recall_user", {})


async def read(session: ClientSession, uri: str) -> str:
    (contents,) = wire(await read_uri(session, uri))["contents"]
    assert contents["mimeType"] == "application/json"
    body: str = contents["text"]
    return body


async def test_remember_has_the_sidecars_size_limit(server: SidecarThread) -> None:
    """One limit: the schema's maxLength is the sidecar's, a memory that long is stored, one longer is
    refused by the schema before the sidecar is asked."""
    assert MAX_MEMORY_CHARS == MAX_CONTENT_CHARS
    async with stdio(server.target, "--user", new_user()) as s:
        schema = (await tools_of(s))["remember"]["inputSchema"]
        assert schema["properties"]["content"]["maxLength"] == MAX_CONTENT_CHARS
        longest = ("The user keeps a long diary of garden notes. " * 100)[: MAX_CONTENT_CHARS - 1] + "."
        assert (await ok(s, "remember", content=longest))["outcome"] == "created"
        too_long = await refused(s, "remember", content=longest + "x")
        assert "validation" in text(too_long).lower()


def test_stdio_ends_cleanly_when_stdin_closes(server: SidecarThread) -> None:
    """The client closes stdin: exit 0, nothing on stderr (was a ValueError traceback and exit 1)."""
    lines = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
    ]
    cmd = [sys.executable, "-m", "memlane_server.cli", "mcp", "--target", server.target, "--user", new_user()]
    proc = subprocess.Popen(
        cmd, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    for line in lines:
        proc.stdin.write(json.dumps(line) + "\n")
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline())  # positive control: it served before stdin closed
    assert answer["result"]["serverInfo"]["name"] == "memlane"
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()


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
    # --allow-remote names the host clients use; a bare flag or a URL is not a name.
    bare = start("--user", "alice", "--transport", "http", "--listen", "0.0.0.0:0", "--allow-remote")
    assert bare.returncode == 2 and "--allow-remote" in bare.stderr
    url = start("--user", "alice", "--transport", "http", "--allow-remote", "http://mcp.example/")
    assert url.returncode == 2 and "HOST:PORT" in url.stderr
    assert start("--user", "alice", "--max-sessions", "0").returncode == 2


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
def http_server(target: str, *flags: str, log: Path | None = None) -> Iterator[str]:
    """``memlane mcp --transport http`` on a free loopback port; yields its URL (stderr: ``log``)."""
    with tempfile.TemporaryDirectory() as d:
        log = log or Path(d) / "stderr"
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
        async with streamable_http_client(url) as streams, ClientSession(streams[0], streams[1]) as s:
            await s.initialize()
            assert (await tools_of(s)).keys() == TOOLS
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


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
MCP_HEADERS = {"accept": "application/json, text/event-stream"}


async def test_http_sessions_are_capped_and_idle_ones_closed(server: SidecarThread) -> None:
    """3,200 `initialize` calls grew the endpoint from 73 to 299 MB: sessions are now capped (503 past
    --max-sessions) and one idle past --session-idle-timeout is closed, which frees its place."""
    with http_server(
        server.target, "--user", new_user(), "--max-sessions", "2", "--session-idle-timeout", "1"
    ) as url:
        async with httpx.AsyncClient() as h:
            opened = [await h.post(url, json=INITIALIZE, headers=MCP_HEADERS) for _ in range(2)]
            assert [r.status_code for r in opened] == [200, 200]
            assert (await h.post(url, json=INITIALIZE, headers=MCP_HEADERS)).status_code == 503
            # The two go idle and are closed; a new session then opens (polled, not slept for).
            reopened = wait_for_async(lambda: h.post(url, json=INITIALIZE, headers=MCP_HEADERS))
            assert (await reopened).status_code == 200
            gone = await h.post(
                url,
                json={"jsonrpc": "2.0", "id": 2, "method": "ping"},
                headers={**MCP_HEADERS, "mcp-session-id": opened[0].headers["mcp-session-id"]},
            )
            assert gone.status_code == 404  # the client initializes again


async def wait_for_async(post: Any, timeout: float = 60.0) -> httpx.Response:
    """Retries ``post()`` until it is answered 200, for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        response: httpx.Response = await post()
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        await asyncio.sleep(0.05)


async def test_allow_remote_widens_the_allowed_hosts_and_keeps_the_checks(server: SidecarThread) -> None:
    with http_server(server.target, "--user", new_user(), "--allow-remote", "mcp.example.test") as url:
        port = url.split(":")[2].split("/")[0]
        async with httpx.AsyncClient() as h:
            named = await h.post(
                url, json=INITIALIZE, headers={**MCP_HEADERS, "host": f"mcp.example.test:{port}"}
            )
            assert named.status_code == 200
            origin = await h.post(
                url, json=INITIALIZE, headers={**MCP_HEADERS, "origin": "https://mcp.example.test"}
            )
            assert origin.status_code == 200
            # Every other name is still refused: the checks are on, not off.
            other = await h.post(url, json=INITIALIZE, headers={**MCP_HEADERS, "host": "evil.example:80"})
            assert other.status_code == 421
            evil = await h.post(
                url, json=INITIALIZE, headers={**MCP_HEADERS, "origin": "http://evil.example"}
            )
            assert evil.status_code == 403


async def test_http_logs_are_json_and_a_disconnect_is_no_traceback(
    server: SidecarThread, tmp_path: Path
) -> None:
    log = tmp_path / "stderr"
    with http_server(server.target, "--user", new_user(), "--log-format", "json", log=log) as url:
        async with streamable_http_client(url) as streams, ClientSession(streams[0], streams[1]) as s:
            await s.initialize()
            assert (await tools_of(s)).keys() == TOOLS
        # A client that opens the event stream of its session and drops it.
        async with httpx.AsyncClient() as h:
            sid = (await h.post(url, json=INITIALIZE, headers=MCP_HEADERS)).headers["mcp-session-id"]
            headers = {**MCP_HEADERS, "mcp-session-id": sid}
            await h.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
            async with h.stream("GET", url, headers={"accept": "text/event-stream", "mcp-session-id": sid}):
                pass
            # The session is gone once the server has handled the drop and the client's DELETE.
            await h.delete(url, headers=headers)
            gone = await h.post(url, json={"jsonrpc": "2.0", "id": 9, "method": "ping"}, headers=headers)
            assert gone.status_code == 404
    # Read once the server has stopped, so everything it logged is there.
    lines = [x for x in log.read_text().splitlines() if x and not x.startswith("memlane mcp: listening on")]
    records = [json.loads(x) for x in lines]  # every line is one JSON object, as the sidecar's
    assert {"ts", "level", "logger", "msg"} <= records[0].keys()
    assert not [r for r in records if r["level"] in ("error", "critical") or "exc" in r]
    assert any(r["logger"] == "memlane.mcp" and r["msg"] == "mcp http listening" for r in records)
