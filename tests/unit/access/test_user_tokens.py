"""End-user tokens (access/policy.py ``UserTokenRules``): the end user is the ``sub`` of a token signed
by a key this sidecar holds, with the algorithm that key declares; anything else is UNAUTHENTICATED."""

from __future__ import annotations

import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import OKPAlgorithm

from memlane_server.access.policy import KeysError, UserTokenRules, parse_jwks
from memlane_server.errors import Unauthenticated

PRIVATE = Ed25519PrivateKey.generate()
JWK = {**json.loads(OKPAlgorithm.to_jwk(PRIVATE.public_key())), "kid": "login-1", "alg": "EdDSA"}
KEYS = parse_jwks({"keys": [JWK]}, "test")


def _token(sub: object = "ana", expires_in: float = 86400, kid: str = "login-1", **claims: object) -> str:
    payload = {"sub": sub, "exp": int(time.time() + expires_in), **claims}
    return jwt.encode(payload, PRIVATE, algorithm="EdDSA", headers={"kid": kid})


def test_a_valid_token_names_its_user() -> None:
    assert UserTokenRules().verify(_token(), KEYS) == "ana"
    assert UserTokenRules(file_keys=KEYS).verify(_token(), ()) == "ana"


@pytest.mark.parametrize(
    ("token", "keys", "fault"),
    [
        (_token(), (), "no verifying keys"),
        ("not.a.jwt", KEYS, "not a well-formed JWT"),
        (_token(kid="other"), KEYS, "does not have"),
        (_token(expires_in=-3600), KEYS, "expired"),
        (_token(sub=""), KEYS, "non-empty string"),
    ],
)
def test_a_token_that_does_not_hold_is_refused(token: str, keys: tuple[jwt.PyJWK, ...], fault: str) -> None:
    with pytest.raises(Unauthenticated, match=fault):
        UserTokenRules().verify(token, keys)


def test_the_audience_is_checked_when_configured() -> None:
    rules = UserTokenRules(audience="memlane")
    assert rules.verify(_token(aud="memlane"), KEYS) == "ana"
    with pytest.raises(Unauthenticated):
        rules.verify(_token(aud="elsewhere"), KEYS)


def test_an_unusable_jwks_says_where() -> None:
    with pytest.raises(KeysError, match="policy: a JWKS needs a 'keys' list"):
        parse_jwks({"keys": "x"}, "policy")
    with pytest.raises(KeysError, match=r"policy: keys\[0\]"):
        parse_jwks({"keys": [{"kty": "nope"}]}, "policy")
