"""The viewer's routes: parse the path (every segment percent-decoded on its own: ids are hostile), let
the request in (``ViewerAccess``), read through the API, render a template (autoescaped); and mounting
the viewer on a sidecar's admin port (``viewer_for``)."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode

from google.protobuf import field_mask_pb2
from jinja2 import Environment, FileSystemLoader, select_autoescape

import memlane
from memlane.v1 import context_pb2, memory_pb2, session_pb2

from ..access.policy import PolicyFile
from ..config import AccessSettings
from ..errors import MemlaneError as DomainError
from ..errors import PermissionDenied, Unauthenticated
from ..observability.http_endpoint import HttpEndpoint, HttpRequest, HttpResponse
from . import pages
from .access import Grant, ViewerAccess

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


def _date_of(ms: int, ends_range: bool = False) -> str:
    """A filter's date as a date input shows it (an end of range was stored as the next day's start)."""
    if not ms:
        return ""
    moment = dt.datetime.fromtimestamp(ms / 1000, dt.UTC) - (
        dt.timedelta(days=1) if ends_range else dt.timedelta()
    )
    return moment.strftime("%Y-%m-%d")


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=select_autoescape(default=True),
    )
    env.globals.update(
        url=url,
        when=_when,
        date_of=_date_of,
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
        match parts, post:
            case [], False:
                return await self._index(c, request, grant)
            case ["users", user], False:
                return await self._user(c, user, grant)
            case ["users", user, "memories"], False:
                return await self._memories(c, user, request, grant)
            case ["users", user, "merge"], _:
                return await self._merge(c, user, request, grant, post=post)
            case ["users", user, "wipe"], False:
                return self._page("wipe.html", grant=grant, user_id=user, erased=None, message="")
            case ["users", user, "wipe"], True:
                return await self._wipe(c, user, request, grant)
            case ["users", user, "memories", memory_id], False:
                return await self._memory(c, user, memory_id, grant)
            case ["users", user, "memories", memory_id, "edit"], True:
                return await self._edit(c, user, memory_id, request)
            case ["users", user, "memories", memory_id, "delete"], _:
                return await self._delete_memory(c, user, memory_id, grant, post=post)
            case ["sessions", session_id], False:
                return await self._session(c, session_id, grant)
            case ["sessions", session_id, "traces", trace_id], False:
                return await self._trace(c, session_id, trace_id, grant)
        return self._page("error.html", "404 Not Found", message="no such page")

    async def _login(self, request: HttpRequest) -> HttpResponse:
        if not self._access.auth_required:
            return _redirect(url())
        if request.method == "POST":
            token = (request.form.get("token") or [""])[0].strip()
            try:
                cookie = self._access.sign_in(request, token, path=PREFIX)
            except (Unauthenticated, PermissionDenied) as exc:
                return self._page("login.html", "401 Unauthorized", message=str(exc))
            return _redirect(url(), {"Set-Cookie": cookie})
        return self._page("login.html", message="")

    async def _index(self, c: memlane.AsyncClient, request: HttpRequest, grant: Grant) -> HttpResponse:
        user = _arg(request, "user")
        if user:
            return _redirect(url("users", user))
        query, token = _arg(request, "q"), _arg(request, "page")
        page = await pages.users(c, query, token)
        return self._page("index.html", grant=grant, query=query, page=page, token=token)

    async def _user(self, c: memlane.AsyncClient, user_id: str, grant: Grant) -> HttpResponse:
        sessions = await pages.user_sessions(c, user_id)
        return self._page(
            "user.html", grant=grant, user_id=user_id, sessions=sessions, status_of=pages.status_of
        )

    async def _memories(
        self, c: memlane.AsyncClient, user_id: str, request: HttpRequest, grant: Grant
    ) -> HttpResponse:
        try:
            q = _memory_query(request)
        except ValueError as exc:
            return self._page("error.html", "400 Bad Request", message=str(exc))
        token = _arg(request, "page")
        page = await pages.memory_list(c, user_id, q, token)
        more = _query_string(request, page=page.next_token) if page.next_token else ""
        return self._page(
            "memories.html",
            grant=grant,
            user_id=user_id,
            q=q,
            page=page,
            more=more,
            kinds=_KINDS,
            scopes=_SCOPES,
        )

    async def _memory(
        self, c: memlane.AsyncClient, user_id: str, memory_id: str, grant: Grant, message: str = ""
    ) -> HttpResponse:
        detail = await pages.memory_detail(c, user_id, memory_id)
        return self._page(
            "memory.html",
            "400 Bad Request" if message else "200 OK",
            grant=grant,
            user_id=user_id,
            d=detail,
            kinds=_KINDS,
            scopes=_SCOPES,
            message=message,
            reason=lambda v: pages.enum_name(memory_pb2.MemoryChangeReason, v, "MEMORY_CHANGE_REASON_"),
            date_input=_date_input,
        )

    async def _edit(
        self, c: memlane.AsyncClient, user_id: str, memory_id: str, request: HttpRequest
    ) -> HttpResponse:
        """Through UpdateMemory, naming only what changed: the version it journals says who changed
        what (its changed_by is the viewer's caller)."""
        caller = memory_pb2.Caller(user_id=user_id)
        now = (await c.get_memory(caller=caller, memory_id=memory_id)).memory
        form = request.form
        new = memory_pb2.Memory(memory_id=memory_id)
        new.content = (form.get("content") or [now.content])[0].replace("\r\n", "\n").strip()
        new.slot = (form.get("slot") or [now.slot])[0].strip()
        new.kind = _KINDS.get((form.get("kind") or [""])[0], now.kind)
        new.scope = _SCOPES.get((form.get("scope") or [""])[0], now.scope)
        try:
            new.valid_until_unix_ms = _date_ms((form.get("valid_until") or [""])[0], end_of_day=True)
        except ValueError as exc:
            return self._page("error.html", "400 Bad Request", message=str(exc))
        fields = ("content", "slot", "kind", "scope", "valid_until_unix_ms")
        paths = [f for f in fields if getattr(new, f) != getattr(now, f)]
        if paths:
            await c.update_memory(
                caller=caller, memory=new, update_mask=field_mask_pb2.FieldMask(paths=paths)
            )
        return _redirect(url("users", user_id, "memories", memory_id))

    async def _merge(
        self, c: memlane.AsyncClient, user_id: str, request: HttpRequest, grant: Grant, *, post: bool
    ) -> HttpResponse:
        """GET: the chosen memories and the merged text to confirm; POST: MergeMemories."""
        source = request.form if post else request.query
        ids = [i for i in source.get("id", []) if i]
        if len(ids) < 2:
            message = "Choose at least two memories to merge (the boxes on the memories page)."
            return self._page("error.html", "400 Bad Request", message=message)
        if not post:
            chosen = await pages.memories_named(c, user_id, ids)
            return self._page("merge.html", grant=grant, user_id=user_id, chosen=chosen)
        content = (request.form.get("content") or [""])[0].replace("\r\n", "\n").strip()
        keep = (request.form.get("keep") or [ids[0]])[0]
        ids = [keep, *(i for i in ids if i != keep)]  # MergeMemories keeps the first it is given
        out = await c.merge_memories(
            caller=memory_pb2.Caller(user_id=user_id), memory_ids=ids, content=content
        )
        return _redirect(url("users", user_id, "memories", out.memory.memory_id))

    async def _wipe(
        self, c: memlane.AsyncClient, user_id: str, request: HttpRequest, grant: Grant
    ) -> HttpResponse:
        if (request.form.get("confirm") or [""])[0] != user_id:
            message = "Type the user id exactly to confirm; nothing was erased."
            return self._page(
                "wipe.html", "400 Bad Request", grant=grant, user_id=user_id, erased=None, message=message
            )
        erased = dict((await c.forget_user(user_id=user_id)).erased)
        return self._page("wipe.html", grant=grant, user_id=user_id, erased=erased, message="")

    async def _delete_memory(
        self, c: memlane.AsyncClient, user_id: str, memory_id: str, grant: Grant, *, post: bool
    ) -> HttpResponse:
        caller = memory_pb2.Caller(user_id=user_id)
        if not post:  # destructive: the memory shown, and a button to confirm
            memory = (await c.get_memory(caller=caller, memory_id=memory_id)).memory
            return self._page("delete.html", grant=grant, user_id=user_id, memory=memory)
        await c.delete_memory(caller=caller, memory_id=memory_id)
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
        self, c: memlane.AsyncClient, session_id: str, trace_id: str, grant: Grant
    ) -> HttpResponse:
        session = (await c.get_session(session_id=session_id)).session
        trace = (await c.get_turn_trace(session_id=session_id, trace_id=trace_id)).trace
        blocks = await pages.trace_blocks(c, session.user_id, trace)
        return self._page("trace.html", grant=grant, session=session, trace=trace, blocks=blocks)


_KINDS = {n.removeprefix("MEMORY_KIND_").lower(): v for n, v in memory_pb2.MemoryKind.items() if v}
_SCOPES = {n.removeprefix("MEMORY_SCOPE_").lower(): v for n, v in memory_pb2.MemoryScope.items() if v}
_STATES = ("active", "retired", "all")


def _arg(request: HttpRequest, name: str) -> str:
    return (request.query.get(name) or [""])[0].strip()


def _date_ms(text: str, *, end_of_day: bool = False) -> int:
    """``YYYY-MM-DD`` (or an ISO time) as UTC milliseconds; empty is 0. A bare date that ends a range
    means the end of that day."""
    text = text.strip()
    if not text:
        return 0
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a date (YYYY-MM-DD)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    if end_of_day and len(text) == 10:
        moment += dt.timedelta(days=1)
    return int(moment.timestamp() * 1000)


def _date_input(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M") if ms else ""


def _memory_query(request: HttpRequest) -> pages.MemoryQuery:
    """The filters of the memories page; raises ValueError for one that does not parse."""
    state = _arg(request, "state") or "active"
    if state not in _STATES:
        raise ValueError(f"state must be one of {', '.join(_STATES)}")
    return pages.MemoryQuery(
        text=_arg(request, "q"),
        kinds=[_KINDS[k] for k in request.query.get("kind", []) if k in _KINDS],
        scopes=[_SCOPES[s] for s in request.query.get("scope", []) if s in _SCOPES],
        agent=_arg(request, "agent"),
        slot=_arg(request, "slot"),
        state=state,
        since_ms=_date_ms(_arg(request, "since")),
        until_ms=_date_ms(_arg(request, "until"), end_of_day=True),
    )


def _query_string(request: HttpRequest, **replace: str) -> str:
    """The request's query string with some values replaced (the "more" link keeps the filters)."""
    pairs = [(k, v) for k, vs in request.query.items() if k not in replace for v in vs]
    pairs += [(k, v) for k, v in replace.items() if v]
    return urlencode(pairs)


# --- Putting the viewer on a sidecar's admin port ------------------------------------------------------

log = logging.getLogger(__name__)


def viewer_for(
    admin: HttpEndpoint, addresses: list[str], settings: AccessSettings, policy: PolicyFile
) -> Viewer | None:
    """Mounts the viewer under ``/viewer/``. It reads through the sidecar's own gRPC API: over its Unix
    socket if it has one, else over loopback TCP (a TLS-only TCP listener needs a Unix socket for it)."""
    local = [a for a in addresses if a.startswith("unix:")]
    if not local and not settings.tls_cert_file:
        local = [f"127.0.0.1:{a.rsplit(':', 1)[1]}" for a in addresses]
    if not local:
        log.warning("memory viewer disabled: with TLS it needs a unix: listen address to call the API")
        return None
    viewer = Viewer(ViewerAccess(policy, auth_required=settings.auth_required), local[0])
    admin.mount(PREFIX + "/", viewer)
    return viewer
