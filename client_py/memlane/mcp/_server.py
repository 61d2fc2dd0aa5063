"""The MCP side: the SDK's low-level server (our schemas as they are, strict input validation), served
over stdio or streamable HTTP. The low-level server rather than FastMCP: FastMCP builds schemas from
function signatures and ignores unknown arguments, and a one-user server must refuse ``user_id``."""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

import memlane

from .._client import AsyncClient
from ._options import HTTP_PATH, McpOptions, split_listen
from ._tools import ToolFailure, Tools

INSTRUCTIONS = (
    "memlane is this assistant's memory. Record each exchange with add_messages (one session_id per"
    " conversation), read get_context before answering, store durable facts about the user with remember,"
    " and look things up with search_memories."
)


def build_server(tools: Tools) -> Server[Any, Any]:
    """An MCP server exposing ``tools``; errors come back as tool errors (``isError``) whose text and
    structured content carry the sidecar's code, reason and field."""
    server: Server[Any, Any] = Server("memlane", version=memlane.__version__, instructions=INSTRUCTIONS)
    listed = [
        types.Tool(name=t.name, description=t.description, inputSchema=t.model.model_json_schema())
        for t in tools.tools
    ]

    @server.list_tools()  # type: ignore[no-untyped-call,untyped-decorator]
    async def _list() -> list[types.Tool]:
        return listed

    @server.call_tool()  # type: ignore[untyped-decorator]
    async def _call(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        try:
            text, data = await tools.call(name, arguments)
        except ToolFailure as exc:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=str(exc))],
                structuredContent=exc.data,
                isError=True,
            )
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structuredContent=data
        )

    return server


def _client(options: McpOptions) -> AsyncClient:
    return AsyncClient(
        options.target,
        token=options.token,
        user_token=options.user_token,
        agent_id=options.agent_id,
        timeout=options.timeout,
    )


async def serve_stdio(options: McpOptions) -> None:
    client = _client(options)
    try:
        server = build_server(Tools(client, options))
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        await client.close()


def _security(host: str, allow_remote: bool) -> TransportSecuritySettings:
    """DNS-rebinding protection: a web page the user opens must not reach a loopback endpoint through a
    name that resolves to 127.0.0.1. Off only for an endpoint deliberately exposed (--allow-remote)."""
    if allow_remote:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


class _Endpoint:
    """The ASGI app of the one MCP path (a class, so Starlette hands it every method unchanged)."""

    def __init__(self, manager: StreamableHTTPSessionManager) -> None:
        self._manager = manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._manager.handle_request(scope, receive, send)


async def serve_http(options: McpOptions) -> None:
    host, port = split_listen(options.listen)
    client = _client(options)
    manager = StreamableHTTPSessionManager(
        app=build_server(Tools(client, options)), security_settings=_security(host, options.allow_remote)
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app = Starlette(routes=[Route(HTTP_PATH, endpoint=_Endpoint(manager))], lifespan=lifespan)
    # Bound here, not by uvicorn, so port 0 works and the address is known before the first request.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"memlane mcp: listening on http://{shown}:{bound}{HTTP_PATH}", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    try:
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        sock.close()
        await client.close()
