"""The access policy: bearer tokens, agents' roles, groups and delegations, from a YAML file (a mounted
Kubernetes Secret in production), and the rules for end-user tokens whose keys it may hold. The file
is re-read when it changes; no restart needed.

    tokens:                       # bearer token -> agent; store sha256 digests, not the tokens
      - sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
        agent: planner
        expires_at: 2027-01-01T00:00:00Z      # optional
      - token: dev-only-plaintext
        agent: researcher
    agents:
      planner:   {roles: [orchestrator], groups: [research], delegates: [researcher, writer]}
      auditor-1: {roles: [auditor]}
      writer:    {procedure_approval: auto}  # its proposed procedures need no admin (default: setting)
    groups:
      research: [planner, researcher]         # members; adds to agents.<name>.groups
    user_token_jwks:                          # optional: keys verifying end-user tokens (User tokens, below)
      keys: [{kty: OKP, crv: Ed25519, kid: login-1, x: 11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo}]
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import yaml

from ..errors import Unauthenticated
from ..infra.periodic import Periodic
from .identity import Caller, CallerRole

log = logging.getLogger(__name__)


class PolicyError(ValueError):
    """The policy file cannot be used; the message names the entry."""


@dataclass(frozen=True, slots=True)
class _Token:
    agent_id: str
    expires_at: dt.datetime | None


def _parse_token(entry: Any, where: str) -> tuple[str, _Token]:
    """One ``tokens`` entry: the sha256 of the bearer token (given, or hashed from a plain token) and
    whose it is, until when."""
    if not isinstance(entry, dict) or not entry.get("agent"):
        raise PolicyError(f"{where} needs an agent")
    if entry.get("sha256"):
        digest = str(entry["sha256"]).lower()
    elif entry.get("token"):
        digest = hashlib.sha256(str(entry["token"]).encode()).hexdigest()
    else:
        raise PolicyError(f"{where} needs a sha256 or a token")
    expires = entry.get("expires_at")
    if isinstance(expires, str):
        try:
            expires = dt.datetime.fromisoformat(expires.replace("Z", "+00:00"))
        except ValueError as exc:
            raise PolicyError(f"{where}.expires_at is not an ISO-8601 time") from exc
    if isinstance(expires, dt.datetime) and expires.tzinfo is None:
        expires = expires.replace(tzinfo=dt.UTC)
    return digest, _Token(str(entry["agent"]), expires)


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    tokens: dict[str, _Token]  # sha256 hex of the token -> entry
    callers: dict[str, Caller]  # agent id -> identity (roles, groups, delegates)
    user_keys: tuple[jwt.PyJWK, ...] = ()  # verify end-user tokens
    # agent id -> "auto" | "human": how its proposed procedures are approved (procedures/service.py)
    procedure_approval: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def parse(data: Any, source: str = "policy") -> AccessPolicy:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise PolicyError(f"{source}: expected a mapping at the top level")
        agents: dict[str, dict[str, Any]] = {}
        for name, spec in (data.get("agents") or {}).items():
            if not isinstance(spec, dict):
                raise PolicyError(f"{source}: agents.{name} must be a mapping")
            agents[str(name)] = spec
        groups: dict[str, set[str]] = {}
        for name, spec in agents.items():
            for g in spec.get("groups") or []:
                groups.setdefault(str(g), set()).add(name)
        for g, members in (data.get("groups") or {}).items():
            for m in members or []:
                groups.setdefault(str(g), set()).add(str(m))
                agents.setdefault(str(m), {})
        tokens: dict[str, _Token] = {}
        for i, entry in enumerate(data.get("tokens") or []):
            digest, token = _parse_token(entry, f"{source}: tokens[{i}]")
            tokens[digest] = token
            agents.setdefault(token.agent_id, {})
        callers: dict[str, Caller] = {}
        approval: dict[str, str] = {}
        for name, spec in agents.items():
            mode = spec.get("procedure_approval")
            if mode is not None:
                if mode not in ("auto", "human"):
                    raise PolicyError(f"{source}: agents.{name}.procedure_approval must be auto or human")
                approval[name] = str(mode)
            try:
                roles = frozenset(CallerRole(r) for r in (spec.get("roles") or ["agent"]))
            except ValueError as exc:
                raise PolicyError(f"{source}: agents.{name}.roles: {exc}") from exc
            callers[name] = Caller(
                agent_id=name,
                roles=roles,
                groups=frozenset(g for g, members in groups.items() if name in members),
                delegates=frozenset(str(d) for d in spec.get("delegates") or []),
            )
        user_keys: tuple[jwt.PyJWK, ...] = ()
        if data.get("user_token_jwks") is not None:
            try:
                user_keys = parse_jwks(data["user_token_jwks"], f"{source}: user_token_jwks")
            except KeysError as exc:
                raise PolicyError(str(exc)) from exc
        return AccessPolicy(tokens, callers, user_keys, approval)

    def caller_for_token(self, token: str, now: dt.datetime | None = None) -> Caller:
        entry = self.tokens.get(hashlib.sha256(token.encode()).hexdigest())
        if entry is None:
            raise Unauthenticated("the bearer token is not valid")
        if entry.expires_at is not None and (now or dt.datetime.now(dt.UTC)) >= entry.expires_at:
            raise Unauthenticated(f"the bearer token of agent {entry.agent_id!r} has expired")
        return self.caller_for_agent(entry.agent_id, how="token")

    def caller_for_agent(self, agent_id: str, how: str) -> Caller:
        known = self.callers.get(agent_id)
        if known is None:
            return Caller(agent_id=agent_id, how=how)
        return Caller(known.agent_id, known.roles, known.groups, known.delegates, how=how)


EMPTY = AccessPolicy({}, {})


class PolicyFile:
    """Holds the current policy and reloads it when the file changes (checked every ``interval``
    seconds). A broken edit is logged and the last good policy stays in force."""

    def __init__(self, path: Path | None, interval: float = 2.0) -> None:
        self.path = path
        self.interval = interval
        self.policy = EMPTY
        self._stamp: tuple[float, int, int] | None = None
        self._watcher = Periodic("policy-reload", self._reload, interval)
        if path is not None:
            self.policy = self._load()  # a broken file at start is fatal: fail fast, not open

    def _file_stamp(self) -> tuple[float, int, int]:
        assert self.path is not None
        st = os.stat(self.path)  # follows the symlink a Kubernetes Secret mount swaps on update
        return (st.st_mtime, st.st_size, st.st_ino)

    def _load(self) -> AccessPolicy:
        assert self.path is not None
        stamp = self._file_stamp()
        try:
            data = yaml.safe_load(self.path.read_text())
        except yaml.YAMLError as exc:
            raise PolicyError(f"{self.path}: {exc}") from exc
        policy = AccessPolicy.parse(data, str(self.path))
        self._stamp = stamp
        return policy

    def reload_if_changed(self) -> bool:
        if self.path is None:
            return False
        try:
            if self._file_stamp() == self._stamp:
                return False
            self.policy = self._load()
        except (OSError, PolicyError) as exc:
            log.error("access policy not reloaded; keeping the previous one", extra={"error": str(exc)})
            return False
        log.info("access policy reloaded", extra={"agents": len(self.policy.callers)})
        return True

    def start(self) -> None:
        if self.path is not None:
            self._watcher.interval_s = self.interval
            self._watcher.start()

    async def stop(self) -> None:
        await self._watcher.stop()

    async def _reload(self) -> None:
        await asyncio.to_thread(self.reload_if_changed)


# --- User tokens ---------------------------------------------------------------------------------------
# End-user binding: a signed token (JWT) whose ``sub`` is the end user a call is made for.
#
# An agent's bearer token says which agent calls; it does not say for whom. With a user token the
# sidecar also knows the end user, from a party the agent cannot impersonate (the application's login
# service signs it; the sidecar holds only the verifying keys), and every user-scoped RPC is held to that
# user (``api.interceptor.UserBinding``). Keys are a JWKS: inline in the access policy file
# (``user_token_jwks``, reloaded with it) and/or a JWKS file (the ``user_token_jwks_file`` setting).
# Verified with PyJWT: the signature with the key the token's ``kid`` names, the algorithm that key
# declares (never the token's choice, so ``none`` and HMAC-with-a-public-key are refused), ``exp``
# required, ``iss``/``aud`` when configured.

USER_TOKEN_HEADER = "x-memlane-user-token"
_LEEWAY_S = 30.0  # clock skew between the token's issuer and this sidecar


class KeysError(ValueError):
    """A JWKS cannot be used; the message says where."""


def parse_jwks(data: Any, source: str) -> tuple[jwt.PyJWK, ...]:
    """The usable signing keys of a JWKS mapping (``{"keys": [...]}``); raises KeysError."""
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise KeysError(f"{source}: a JWKS needs a 'keys' list")
    keys: list[jwt.PyJWK] = []
    for i, entry in enumerate(data["keys"]):
        try:
            keys.append(jwt.PyJWK(entry))
        except (jwt.PyJWKError, jwt.InvalidKeyError, TypeError, ValueError) as exc:
            raise KeysError(f"{source}: keys[{i}]: {exc}") from exc
    return tuple(keys)


def load_jwks_file(path: Path) -> tuple[jwt.PyJWK, ...]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KeysError(f"{path}: {exc}") from exc
    return parse_jwks(data, str(path))


@dataclass(frozen=True, slots=True)
class UserTokenRules:
    """The settings of user binding; keys from the file here, keys from the policy file per call."""

    required: bool = False
    file_keys: tuple[jwt.PyJWK, ...] = ()
    issuer: str = ""
    audience: str = ""

    def verify(self, token: str, policy_keys: Sequence[jwt.PyJWK]) -> str:
        """The end user (``sub``) of a valid token; raises Unauthenticated otherwise."""
        keys = [*policy_keys, *self.file_keys]
        if not keys:
            raise Unauthenticated("user tokens are not accepted here: no verifying keys are configured")
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.InvalidTokenError:
            raise Unauthenticated("the user token is not a well-formed JWT") from None
        candidates = [k for k in keys if k.key_id == kid] if kid else keys
        if not candidates:
            raise Unauthenticated("the user token names a key (kid) this sidecar does not have")
        expired = False
        for key in candidates:
            try:
                claims = jwt.decode(
                    token,
                    key=key,
                    algorithms=[key.algorithm_name],
                    audience=self.audience or None,
                    issuer=self.issuer or None,
                    leeway=_LEEWAY_S,
                    options={"require": ["exp", "sub"], "verify_aud": bool(self.audience)},
                )
            except jwt.ExpiredSignatureError:
                expired = True
                continue
            except jwt.InvalidTokenError:
                continue
            sub = claims.get("sub")
            if not isinstance(sub, str) or not sub:
                raise Unauthenticated("the user token's sub (the end user) must be a non-empty string")
            return sub
        if expired:
            raise Unauthenticated("the user token has expired")
        raise Unauthenticated("the user token is not valid (signature, issuer or audience)")
