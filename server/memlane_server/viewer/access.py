"""Who may use the viewer: with auth off, browsers on loopback only; with auth on, a bearer token (header
or the cookie the login form sets) whose caller has the admin role. The token is then the one the viewer
presents to the gRPC API."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from ..access.authenticate import is_local_peer
from ..access.policy import PolicyFile
from ..errors import PermissionDenied, Unauthenticated
from ..infra.endpoints import is_loopback_host
from ..observability.http_endpoint import HttpRequest

COOKIE = "memlane_viewer_token"


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
    for part in request.headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and value:
            return value
    return None


@dataclass(frozen=True, slots=True)
class Grant:
    """A request let in: the token to present to the API (None with auth off) and its CSRF value."""

    token: str | None
    csrf: str


class ViewerAccess:
    def __init__(self, policy: PolicyFile, *, auth_required: bool) -> None:
        self._policy = policy
        self.auth_required = auth_required
        self._secret = secrets.token_bytes(32)  # per process: forms expire with a restart

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
        token = token or bearer_of(request)
        if not token:
            raise Unauthenticated("sign in with an admin token")
        caller = self._policy.policy.caller_for_token(token)
        caller.check_admin("use the memory viewer")
        return Grant(token, self.csrf_for(token))

    def check_csrf(self, request: HttpRequest, grant: Grant) -> None:
        sent = (request.form.get("csrf") or [""])[0]
        if not hmac.compare_digest(sent, grant.csrf):
            raise PermissionDenied("the form is stale or was not sent by the viewer; reload the page")
