"""Who may call: the access policy file (reloaded in the background), the authenticator over it, and the
TLS credentials of the listen addresses."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc

from ..access.authenticate import Authenticator
from ..access.policy import PolicyFile, UserTokenRules, load_jwks_file
from ..config import AccessSettings

log = logging.getLogger("memlane")


def start_policy(a: AccessSettings) -> PolicyFile:
    """The access policy, its reload job started."""
    policy = PolicyFile(
        Path(a.access_policy_file) if a.access_policy_file else None, a.access_policy_reload_seconds
    )
    policy.start()
    return policy


def authenticator(a: AccessSettings, policy: PolicyFile) -> Authenticator:
    if not a.auth_required:
        log.warning(
            "auth is disabled: serving loopback and Unix-socket callers only, identified by the "
            "x-memlane-agent header; set auth_required and access_policy_file in production"
        )
    rules = UserTokenRules(
        required=a.user_token_required,
        file_keys=load_jwks_file(Path(a.user_token_jwks_file)) if a.user_token_jwks_file else (),
        issuer=a.user_token_issuer,
        audience=a.user_token_audience,
    )
    return Authenticator(policy, required=a.auth_required, user_tokens=rules)


def tls_credentials(a: AccessSettings) -> grpc.ServerCredentials | None:
    if not a.tls_cert_file:
        return None
    ca = Path(a.tls_client_ca_file).read_bytes() if a.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(Path(a.tls_key_file).read_bytes(), Path(a.tls_cert_file).read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )
