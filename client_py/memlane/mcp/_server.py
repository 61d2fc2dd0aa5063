"""The MCP side: the SDK's low-level server (our schemas as they are, strict input validation), served
over stdio or streamable HTTP. The low-level server rather than FastMCP: FastMCP builds schemas from
function signatures and ignores unknown arguments, and a one-user server must refuse ``user_id``.

Both SDK lines are served from the same tools, resources and prompts: 1.x registers handlers with
decorators, 2.x takes them in the server's constructor (``on_list_tools=...``, each ``(ctx, params)``).
Everything else is built as MCP's wire dicts and validated into whichever SDK's types are installed.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
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
from ._library import BadPromptArguments, Library, ResourceNotFound
from ._options import HTTP_PATH, McpOptions, split_listen
from ._tools import ToolFailure, Tools

SDK_MAJOR = int(importlib.metadata.version("mcp").split(".", 1)[0])
log = logging.getLogger("memlane.mcp")

INSTRUCTIONS = (
    "memlane is this assistant's memory. Record each exchange with add_messages (one conversation_id per"
    " conversation), read get_context before answering, store durable facts about the user with remember,"
    " and look things up with search_memories. The user's profile and memories are also resources, and"
    " the recall_user prompt puts them into the conversation."
)
# JSON-RPC error codes: MCP's resource-not-found, and JSON-RPC's invalid params and internal error.
RESOURCE_NOT_FOUND = -32002
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# The sidecar's refusals of a resource or prompt read, as JSON-RPC codes; the rest (UNAVAILABLE, ...) is
# this side's trouble, not the request's, and the message carries the sidecar's code and reason.
_RPC_CODES = {"NOT_FOUND": RESOURCE_NOT_FOUND, "INVALID_ARGUMENT": INVALID_PARAMS}


def _rpc_code(failure: ToolFailure) -> int:
    return _RPC_CODES.get(str(failure.data.get("error", {}).get("code")), INTERNAL_ERROR)


class Handlers:
    """What the server answers, independent of the SDK line: wire dicts in, SDK types out."""

    def __init__(self, tools: Tools, library: Library) -> None:
        self._tools, self._library = tools, library
        self.tools = [types.Tool.model_validate(t.wire()) for t in tools.tools]
        self.resources = [types.Resource.model_validate(r) for r in library.resources()]
        self.templates = [types.ResourceTemplate.model_validate(t) for t in library.templates()]
        self.prompts = [types.Prompt.model_validate(p) for p in library.prompts()]

    async def call_tool(self, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        """Errors come back as tool errors (``isError``) whose text and structured content carry the
        sidecar's code, reason and field."""
        try:
            text, data = await self._tools.call(name, arguments or {})
        except ToolFailure as exc:
            return _tool_result(str(exc), exc.data, error=True)
        return _tool_result(text, data, error=False)

    async def read_resource(self, uri: str) -> tuple[str, str]:
        """(mime type, text) of ``uri``; raises the SDK's protocol error for a refusal."""
        try:
            return "application/json", await self._library.read(uri)
        except ResourceNotFound as exc:
            raise _protocol_error(RESOURCE_NOT_FOUND, str(exc)) from None
        except ToolFailure as exc:
            raise _protocol_error(_rpc_code(exc), str(exc)) from None

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
        try:
            return types.GetPromptResult.model_validate(await self._library.prompt(name, arguments or {}))
        except BadPromptArguments as exc:
            raise _protocol_error(INVALID_PARAMS, str(exc)) from None
        except ToolFailure as exc:
            raise _protocol_error(_rpc_code(exc), str(exc)) from None


def _tool_result(text: str, data: dict[str, Any], *, error: bool) -> types.CallToolResult:
    return types.CallToolResult.model_validate(
        {"content": [{"type": "text", "text": text}], "structuredContent": data, "isError": error}
    )


def _protocol_error(code: int, message: str) -> Exception:
    """A JSON-RPC error answer (not a tool error): 2.x's ``MCPError``, 1.x's ``McpError``."""
    if SDK_MAJOR >= 2:
        from mcp.shared.exceptions import MCPError  # type: ignore[attr-defined,unused-ignore]  # noqa: PLC0415

        return MCPError(code, message)  # type: ignore[no-any-return,unused-ignore]
    from mcp.shared.exceptions import McpError  # noqa: PLC0415

    return McpError(types.ErrorData(code=code, message=message))


def build_server(tools: Tools, library: Library) -> Server[Any, Any]:
    """An MCP server with ``tools``, and ``library``'s resources and prompts."""
    h = Handlers(tools, library)
    info: dict[str, Any] = {"version": memlane.__version__, "instructions": INSTRUCTIONS}
    if SDK_MAJOR >= 2:
        return _server_v2(h, info)
    server: Server[Any, Any] = Server("memlane", **info)
    # 1.x: handlers by decorator (untyped in the SDK, hence the ignores).
    server.list_tools()(_const(h.tools))  # type: ignore[no-untyped-call]
    server.list_resources()(_const(h.resources))  # type: ignore[no-untyped-call]
    server.list_resource_templates()(_const(h.templates))  # type: ignore[no-untyped-call]
    server.list_prompts()(_const(h.prompts))  # type: ignore[no-untyped-call]
    server.call_tool()(h.call_tool)

    from mcp.server.lowlevel.helper_types import ReadResourceContents  # noqa: PLC0415

    async def read(uri: Any) -> list[ReadResourceContents]:
        mime, text = await h.read_resource(str(uri))
        return [ReadResourceContents(content=text, mime_type=mime)]

    server.read_resource()(read)  # type: ignore[no-untyped-call]
    server.get_prompt()(h.get_prompt)  # type: ignore[no-untyped-call]
    return server


def _const(value: list[Any]) -> Callable[[], Awaitable[list[Any]]]:
    async def listed() -> list[Any]:
        return value

    return listed


def _server_v2(h: Handlers, info: dict[str, Any]) -> Server[Any, Any]:
    """2.x: the same answers, as constructor handlers taking ``(ctx, params)``."""

    async def list_tools(_: Any, __: Any) -> Any:
        return types.ListToolsResult(tools=h.tools)

    async def call_tool(_: Any, params: Any) -> Any:
        return await h.call_tool(params.name, params.arguments)

    async def list_resources(_: Any, __: Any) -> Any:
        return types.ListResourcesResult(resources=h.resources)

    async def list_templates(_: Any, __: Any) -> Any:
        return types.ListResourceTemplatesResult.model_validate({"resourceTemplates": h.templates})

    async def read_resource(_: Any, params: Any) -> Any:
        mime, text = await h.read_resource(str(params.uri))
        contents = [{"uri": str(params.uri), "mimeType": mime, "text": text}]
        return types.ReadResourceResult.model_validate({"contents": contents})

    async def list_prompts(_: Any, __: Any) -> Any:
        return types.ListPromptsResult(prompts=h.prompts)

    async def get_prompt(_: Any, params: Any) -> Any:
        return await h.get_prompt(params.name, params.arguments)

    handlers: dict[str, Any] = {
        "on_list_tools": list_tools,
        "on_call_tool": call_tool,
        "on_list_resources": list_resources,
        "on_list_resource_templates": list_templates,
        "on_read_resource": read_resource,
        "on_list_prompts": list_prompts,
        "on_get_prompt": get_prompt,
    }
    server: Server[Any, Any] = Server("memlane", **info, **handlers)
    return server


def _client(options: McpOptions) -> AsyncClient:
    return AsyncClient(
        options.target,
        token=options.token,
        user_token=options.user_token,
        agent_id=options.agent_id,
        timeout=options.timeout,
    )


def _build(client: AsyncClient, options: McpOptions) -> Server[Any, Any]:
    tools = Tools(client, options)
    return build_server(tools, Library(tools, options))


@contextlib.contextmanager
def _own_stdio() -> Iterator[dict[str, Any]]:
    """stdin and stdout for 1.x's stdio server, on duplicates of descriptors 0 and 1. 1.x wraps
    ``sys.stdout.buffer`` in a TextIOWrapper of its own, which closes Python's stdout when it is
    collected: the process then fails at exit (``ValueError: I/O operation on closed file``, exit 1).
    Closing a duplicate leaves Python's own alone. 2.x claims the descriptors itself (and diverts fd 1
    to stderr while it serves, so stray prints miss the wire): it gets no streams of ours."""
    if SDK_MAJOR >= 2:
        yield {}
        return
    stdin = open(os.dup(0), encoding="utf-8", errors="replace")  # noqa: SIM115  (closed below)
    stdout = open(os.dup(1), "w", encoding="utf-8", newline="\n")  # noqa: SIM115
    try:
        yield {"stdin": anyio.wrap_file(stdin), "stdout": anyio.wrap_file(stdout)}
    finally:
        stdin.close()
        with contextlib.suppress(OSError):  # the client may be gone: nothing left to flush to
            stdout.close()


async def serve_stdio(options: McpOptions) -> None:
    """Serves until the client closes stdin, then returns (exit 0)."""
    client = _client(options)
    try:
        server = _build(client, options)
        with _own_stdio() as streams:
            async with stdio_server(**streams) as (read, write):
                await server.run(read, write, server.create_initialization_options())
    finally:
        await client.close()


def security(allowed: tuple[str, ...]) -> TransportSecuritySettings:
    """DNS-rebinding protection, always on: a web page the user opens must not reach the endpoint through
    a name that resolves to it. Loopback names are allowed, and the names --allow-remote gives (as Host,
    and as the Origin a browser would send for them), nothing else."""
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    for name in allowed:
        hosts += [name] if ":" in name.rsplit("]", 1)[-1] else [name, f"{name}:*"]
    origins = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


class _Endpoint:
    """The ASGI app of the one MCP path (a class, so Starlette hands it every method unchanged)."""

    def __init__(self, manager: StreamableHTTPSessionManager) -> None:
        self._manager = manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._manager.handle_request(scope, receive, send)


_GONE = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)


class QuietDisconnects(logging.Filter):
    """The SDK logs a client that closed its stream (an SSE GET dropped, a session deleted mid-answer)
    as an error with the stream's traceback ("Error in standalone SSE writer"). Nothing failed on this
    side: one INFO line without the traceback says what happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], _GONE):
            record.msg, record.args = "mcp client disconnected (%s)", (record.getMessage(),)
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info = record.exc_text = None
        return True


async def serve_http(options: McpOptions) -> None:
    host, port = split_listen(options.listen)
    for name in ("mcp.server.streamable_http", "mcp.server.streamable_http_manager"):
        logging.getLogger(name).addFilter(QuietDisconnects())
    client = _client(options)
    manager = StreamableHTTPSessionManager(
        app=_build(client, options),
        security_settings=security(options.allow_remote),
        # Each session holds a server task and its streams (about 70 kB): a bound on how many, and
        # on how long one that sends nothing lives, bounds the memory of the endpoint.
        max_sessions=options.max_sessions,
        session_idle_timeout=options.session_idle_timeout,
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
    # Listening before the address is printed: a client that reads it and connects at once is queued,
    # not refused (uvicorn would only listen once its startup is done).
    sock.listen(2048)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"memlane mcp: listening on http://{shown}:{bound}{HTTP_PATH}", file=sys.stderr, flush=True)
    log.info(
        "mcp http listening",
        extra={"listen": f"{shown}:{bound}", "max_sessions": options.max_sessions},
    )
    # log_config=None: uvicorn's records go to the root handler (the sidecar's JSON under `memlane mcp`),
    # not to a text formatter of its own.
    config = uvicorn.Config(app, log_level="warning", lifespan="on", log_config=None)
    try:
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        sock.close()
        await client.close()
