"""The viewer's routes: parse the path (every segment percent-decoded on its own: ids are hostile), let
the request in (``ViewerAccess``), read through the API, render a template (autoescaped)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from jinja2 import Environment, FileSystemLoader, select_autoescape

import memlane
from memlane.v1 import context_pb2, memory_pb2, session_pb2

from ..errors import MemlaneError as DomainError
from ..errors import PermissionDenied, Unauthenticated
from ..observability.http_endpoint import HttpRequest, HttpResponse
from . import pages
from .access import COOKIE, Grant, ViewerAccess

PREFIX = "/viewer"
_STATUS = {
    memlane.NotFoundError: "404 Not Found",
    memlane.PermissionDeniedError: "403 Forbidden",
    memlane.InvalidArgumentError: "400 Bad Request",
    memlane.UnauthenticatedError: "401 Unauthorized",
}
_HEADERS = {
    # Server-rendered pages with no script: forbid any, and framing.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def url(*segments: str) -> str:
    return PREFIX + "/" + "/".join(quote(s, safe="") for s in segments)


def _when(ms: int) -> str:
    if not ms:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=select_autoescape(default=True),
    )
    env.globals.update(
        url=url,
        when=_when,
        kind=lambda v: pages.enum_name(memory_pb2.MemoryKind, v, "MEMORY_KIND_"),
        scope=lambda v: pages.enum_name(memory_pb2.MemoryScope, v, "MEMORY_SCOPE_"),
        role=lambda v: pages.enum_name(session_pb2.Role, v, "ROLE_"),
        section=lambda v: pages.enum_name(context_pb2.ContextSection, v, "CONTEXT_SECTION_"),
    )
    return env


def _redirect(location: str, headers: dict[str, str] | None = None) -> HttpResponse:
    return HttpResponse("303 See Other", "text/plain", b"", {"Location": location, **(headers or {})})


class Viewer:
    """Mounted on the admin HTTP server under ``/viewer/``; ``target`` is the sidecar's own gRPC address."""

    def __init__(self, access: ViewerAccess, target: str) -> None:
        self._access = access
        self._target = target
        self._env = _environment()
        self._clients: dict[str | None, memlane.AsyncClient] = {}

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()
        self._clients.clear()

    def _client(self, grant: Grant) -> memlane.AsyncClient:
        c = self._clients.get(grant.token)
        if c is None:
            if len(self._clients) >= 16:  # a few operators' tokens, not a cache of every token tried
                self._clients.pop(next(iter(self._clients)))
            c = self._clients[grant.token] = memlane.AsyncClient(self._target, token=grant.token, timeout=30)
        return c

    def _page(self, template: str, status: str = "200 OK", **context: Any) -> HttpResponse:
        html = self._env.get_template(template).render(**context)
        return HttpResponse(status, "text/html; charset=utf-8", html.encode(), dict(_HEADERS))

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        rest = request.raw_path[len(PREFIX) :].strip("/")
        parts = [unquote(p) for p in rest.split("/")] if rest else []
        if parts == ["login"]:
            return await self._login(request)
        try:
            grant = self._access.admit(request)
        except Unauthenticated:
            return _redirect(url("login"))
        except (PermissionDenied, DomainError) as exc:
            return self._page("error.html", "403 Forbidden", message=str(exc))
        if request.method == "POST":
            try:
                self._access.check_csrf(request, grant)
            except PermissionDenied as exc:
                return self._page("error.html", "403 Forbidden", message=str(exc))
        elif request.method != "GET":
            return self._page("error.html", "405 Method Not Allowed", message="GET or POST only")
        try:
            return await self._dispatch(request, parts, grant)
        except memlane.MemlaneError as exc:
            status = next((s for k, s in _STATUS.items() if isinstance(exc, k)), "502 Bad Gateway")
            return self._page("error.html", status, message=f"{type(exc).__name__}: {exc.message}")

    async def _dispatch(self, request: HttpRequest, parts: list[str], grant: Grant) -> HttpResponse:
        c = self._client(grant)
        post = request.method == "POST"
        routes: dict[tuple[str, int, bool], Callable[[], Awaitable[HttpResponse]]] = {
            ("", 0, False): lambda: self._index(request, grant),
            ("users", 2, False): lambda: self._user(c, parts[1], grant),
            ("users", 3, False): lambda: self._user_sub(c, parts[1], parts[2], grant),
            ("users", 3, True): lambda: self._wipe(c, parts[1], parts[2], request, grant),
            ("users", 5, True): lambda: self._delete_memory(c, parts[1], parts[2:], grant),
            ("sessions", 2, False): lambda: self._session(c, parts[1], grant),
            ("sessions", 4, False): lambda: self._trace(c, parts[1], parts[2], parts[3], grant),
        }
        handler = routes.get((parts[0] if parts else "", len(parts), post))
        if handler is None:
            return self._page("error.html", "404 Not Found", message="no such page")
        return await handler()

    async def _login(self, request: HttpRequest) -> HttpResponse:
        if not self._access.auth_required:
            return _redirect(url())
        if request.method == "POST":
            token = (request.form.get("token") or [""])[0].strip()
            try:
                self._access.admit(request, token)
            except (Unauthenticated, PermissionDenied) as exc:
                return self._page("login.html", "401 Unauthorized", message=str(exc))
            cookie = f"{COOKIE}={token}; Path={PREFIX}; HttpOnly; SameSite=Strict"
            return _redirect(url(), {"Set-Cookie": cookie})
        return self._page("login.html", message="")

    async def _index(self, request: HttpRequest, grant: Grant) -> HttpResponse:
        user = (request.query.get("user") or [""])[0].strip()
        if user:
            return _redirect(url("users", user))
        return self._page("index.html", grant=grant)

    async def _user(self, c: memlane.AsyncClient, user_id: str, grant: Grant) -> HttpResponse:
        sessions = await pages.user_sessions(c, user_id)
        return self._page(
            "user.html", grant=grant, user_id=user_id, sessions=sessions, status_of=pages.status_of
        )

    async def _user_sub(self, c: memlane.AsyncClient, user_id: str, what: str, grant: Grant) -> HttpResponse:
        if what == "memories":
            items = await pages.memories(c, user_id)
            return self._page("memories.html", grant=grant, user_id=user_id, memories=items)
        if what == "wipe":
            return self._page("wipe.html", grant=grant, user_id=user_id, erased=None, message="")
        return self._page("error.html", "404 Not Found", message="no such page")

    async def _wipe(
        self, c: memlane.AsyncClient, user_id: str, what: str, request: HttpRequest, grant: Grant
    ) -> HttpResponse:
        if what != "wipe":
            return self._page("error.html", "404 Not Found", message="no such page")
        if (request.form.get("confirm") or [""])[0] != user_id:
            message = "Type the user id exactly to confirm; nothing was erased."
            return self._page(
                "wipe.html", "400 Bad Request", grant=grant, user_id=user_id, erased=None, message=message
            )
        erased = dict((await c.forget_user(user_id=user_id)).erased)
        return self._page("wipe.html", grant=grant, user_id=user_id, erased=erased, message="")

    async def _delete_memory(
        self, c: memlane.AsyncClient, user_id: str, rest: list[str], grant: Grant
    ) -> HttpResponse:
        what, memory_id, action = rest
        if (what, action) != ("memories", "delete"):
            return self._page("error.html", "404 Not Found", message="no such page")
        await c.delete_memory(caller=memory_pb2.Caller(user_id=user_id), memory_id=memory_id)
        return _redirect(url("users", user_id, "memories"))

    async def _session(self, c: memlane.AsyncClient, session_id: str, grant: Grant) -> HttpResponse:
        session = (await c.get_session(session_id=session_id)).session
        messages = await pages.transcript(c, session_id)
        traces = await pages.traces(c, session_id)
        return self._page(
            "session.html",
            grant=grant,
            session=session,
            session_status=pages.status_of(session),
            messages=messages,
            traces=traces,
        )

    async def _trace(
        self, c: memlane.AsyncClient, session_id: str, what: str, trace_id: str, grant: Grant
    ) -> HttpResponse:
        if what != "traces":
            return self._page("error.html", "404 Not Found", message="no such page")
        session = (await c.get_session(session_id=session_id)).session
        trace = (await c.get_turn_trace(session_id=session_id, trace_id=trace_id)).trace
        blocks = await pages.trace_blocks(c, session.user_id, trace)
        return self._page("trace.html", grant=grant, session=session, trace=trace, blocks=blocks)
