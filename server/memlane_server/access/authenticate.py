"""Turns a call's credentials into a Caller: a bearer token, a verified client certificate (mTLS), or,
with auth disabled for development, an agent header that is honoured only on loopback or a Unix socket.
An end-user token (``x-memlane-user-token``), when present or required, binds the call to its user."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ..errors import PermissionDenied, Unauthenticated
from ..ids import normalized
from .identity import UNRESTRICTED, Caller, CallerRole
from .policy import USER_TOKEN_HEADER, PolicyFile, UserTokenRules

AGENT_HEADER = "x-memlane-agent"
_READ_PREFIXES = ("Get", "List", "Search", "Watch", "Export")


def is_local_peer(peer: str) -> bool:
    """grpc peer strings: ``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``unix:/path``."""
    if peer.startswith("unix:"):
        return True
    if peer.startswith("ipv4:"):
        return peer[5:].startswith("127.")
    if peer.startswith("ipv6:"):
        host = peer[5:].rsplit(":", 1)[0]
        return host in ("[::1]", "[::ffff:127.0.0.1]") or host.startswith("[::ffff:127.")
    return False


class Authenticator:
    def __init__(
        self, policy: PolicyFile, *, required: bool, user_tokens: UserTokenRules | None = None
    ) -> None:
        self.policy = policy
        self.required = required
        self.user_tokens = user_tokens or UserTokenRules()

    def authenticate(
        self,
        metadata: Sequence[tuple[str, str | bytes]],
        peer: str,
        auth_context: Mapping[str, Sequence[bytes]],
    ) -> Caller:
        caller = self._agent(metadata, peer, auth_context)
        user_token = next((_text(v) for k, v in metadata if k == USER_TOKEN_HEADER), None)
        if user_token is None:
            if self.user_tokens.required and CallerRole.ADMIN not in caller.roles:
                raise Unauthenticated(
                    f"this sidecar binds every call to an end user: send a user token in {USER_TOKEN_HEADER}"
                )
            return caller
        user = normalized(self.user_tokens.verify(user_token, self.policy.policy.user_keys))
        return dataclasses.replace(caller, user_id=user)

    def _agent(
        self,
        metadata: Sequence[tuple[str, str | bytes]],
        peer: str,
        auth_context: Mapping[str, Sequence[bytes]],
    ) -> Caller:
        token = header = None
        for key, value in metadata:
            if key == "authorization":
                text = _text(value)
                scheme, _, rest = text.partition(" ")
                if scheme.lower() != "bearer" or not rest.strip():
                    raise Unauthenticated("the authorization header must be 'Bearer <token>'")
                token = rest.strip()
            elif key == AGENT_HEADER:
                header = normalized(_text(value))
        if token is not None:
            return self.policy.policy.caller_for_token(token)
        common_names = auth_context.get("x509_common_name")
        if common_names:  # grpc only fills this after verifying the chain against the client CA
            return self.policy.policy.caller_for_agent(common_names[0].decode(), how="mtls")
        if self.required:
            raise Unauthenticated("this sidecar requires credentials: a bearer token or a client certificate")
        if not is_local_peer(peer):
            raise Unauthenticated(
                "auth is disabled, so only loopback and Unix-socket callers are served; enable auth to serve "
                f"{peer}"
            )
        if header:
            return self.policy.policy.caller_for_agent(header, how="header")
        return UNRESTRICTED


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def check_method(caller: Caller, method: str) -> None:
    """Auditors read; every other RPC is a write and is refused to them."""
    if caller.is_auditor and not method.startswith(_READ_PREFIXES):
        raise PermissionDenied(f"agent {caller.agent_id!r} is an auditor and may not call {method}")
