"""Who may use the viewer: with auth off, browsers on loopback only; with auth on, a bearer token whose
caller has the admin role, sent in the Authorization header or signed in through the login form. The
token is then the one the viewer presents to the gRPC API.

The login form's cookie is a session value, not the token: random, mapped to the token in this process
only, ending after ``SESSION_TTL_S`` (or at a restart), so a cookie that leaks (a proxy's log, a shared
browser profile) is not the admin's credential for the gRPC API and stops working by itself. Every
request under a session checks its token against the policy again, so a token removed from the policy
ends its sessions at once. The cookie is ``HttpOnly`` and ``SameSite=Strict``, and ``Secure`` when the
page was served over TLS (the admin port speaks plain HTTP: TLS is a proxy's, told by
``X-Forwarded-Proto: https``; a client that claims it falsely only loses its own cookie over HTTP).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..access.authenticate import is_local_peer
from ..access.policy import PolicyFile
from ..errors import PermissionDenied, Unauthenticated
from ..infra.endpoints import is_loopback_host
from ..observability.http_endpoint import HttpRequest

COOKIE = "memlane_viewer_session"
SESSION_TTL_S = 8 * 3600  # a working day: then sign in again
MAX_SESSIONS = 64  # a few operators' browsers; past it the oldest session ends


def _grpc_style_peer(host: str) -> str:
    return f"ipv6:[{host}]:0" if ":" in host else f"ipv4:{host}:0"


def _loopback_name(host_header: str) -> bool:
    """Whether a Host header names this machine's loopback (``localhost``, ``127.x.x.x``, ``[::1]``,
    with or without a port). A browser sends the name it resolved, so this is what stops DNS rebinding:
    a page on evil.example whose name now points at 127.0.0.1 sends ``Host: evil.example``."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return is_loopback_host(host)


def bearer_of(request: HttpRequest) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, rest = header.partition(" ")
    if scheme.lower() == "bearer" and rest.strip():
        return rest.strip()
    return None


def _cookie_of(request: HttpRequest) -> str | None:
    for part in request.headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and value:
            return value
    return None


def served_over_tls(request: HttpRequest) -> bool:
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return forwarded == "https"


@dataclass(frozen=True, slots=True)
class Grant:
    """A request let in: the token to present to the API (None with auth off) and its CSRF value."""

    token: str | None
    csrf: str


class ViewerAccess:
    def __init__(
        self, policy: PolicyFile, *, auth_required: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._policy = policy
        self.auth_required = auth_required
        self._secret = secrets.token_bytes(32)  # per process: forms expire with a restart
        self._clock = clock
        self._sessions: dict[str, tuple[str, float]] = {}  # cookie value -> (token, ends at), oldest first

    def sign_in(self, request: HttpRequest, token: str, *, path: str) -> str:
        """Admits ``token`` (raises as ``admit`` does) and starts a session for it; returns the
        Set-Cookie header value (the cookie sent back under ``path`` only)."""
        self.admit(request, token)
        now = self._clock()
        for value, (_, ends) in list(self._sessions.items()):
            if ends <= now:
                del self._sessions[value]
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions)))
        value = secrets.token_urlsafe(32)
        self._sessions[value] = (token, now + SESSION_TTL_S)
        secure = "; Secure" if served_over_tls(request) else ""
        return f"{COOKIE}={value}; Path={path}; Max-Age={SESSION_TTL_S}; HttpOnly; SameSite=Strict{secure}"

    def _session_token(self, request: HttpRequest) -> str | None:
        value = _cookie_of(request)
        held = self._sessions.get(value) if value else None
        if held is None:
            return None
        token, ends = held
        if ends <= self._clock():
            del self._sessions[value or ""]
            return None
        return token

    def csrf_for(self, token: str | None) -> str:
        return hmac.new(self._secret, (token or "local").encode(), hashlib.sha256).hexdigest()

    def admit(self, request: HttpRequest, token: str | None = None) -> Grant:
        """Raises Unauthenticated (no or bad token) or PermissionDenied (not loopback, not admin)."""
        if not self.auth_required:
            if not is_local_peer(_grpc_style_peer(request.peer_host)):
                raise PermissionDenied("auth is disabled, so the viewer serves loopback browsers only")
            host = request.headers.get("host")
            if host is not None and not _loopback_name(host):
                raise PermissionDenied(
                    "auth is disabled, so the viewer answers only to a loopback host name (localhost,"
                    " 127.0.0.1, [::1])"
                )
            return Grant(None, self.csrf_for(None))
        token = token or bearer_of(request) or self._session_token(request)
        if not token:
            raise Unauthenticated("sign in with an admin token")
        caller = self._policy.policy.caller_for_token(token)
        caller.check_admin("use the memory viewer")
        return Grant(token, self.csrf_for(token))

    def check_csrf(self, request: HttpRequest, grant: Grant) -> None:
        sent = (request.form.get("csrf") or [""])[0]
        if not hmac.compare_digest(sent, grant.csrf):
            raise PermissionDenied("the form is stale or was not sent by the viewer; reload the page")
