"""End-user binding: a signed token (JWT) whose ``sub`` is the end user a call is made for.

An agent's bearer token says which agent calls; it does not say for whom. With a user token the
sidecar also knows the end user, from a party the agent cannot impersonate (the application's login
service signs it; the sidecar holds only the verifying keys), and every user-scoped RPC is held to that
user (``api.interceptor.UserBinding``). Keys are a JWKS: inline in the access policy file (``user_token_jwks``, reloaded
with it) and/or a JWKS file (the ``user_token_jwks_file`` setting). Verified with PyJWT: the signature
with the key the token's ``kid`` names, the algorithm that key declares (never the token's choice, so
``none`` and HMAC-with-a-public-key are refused), ``exp`` required, ``iss``/``aud`` when configured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from ..errors import Unauthenticated

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
