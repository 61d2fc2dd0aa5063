"""mTLS: a client certificate signed by the configured CA identifies the agent (its common name); a
client without one, or with one from another CA, is refused at the handshake."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import grpc
import pytest
import yaml

import memlane
from memlane import Message, Role, Topology
from tests.conftest import ServerFactory


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)  # fmt: skip


def _leaf(d: Path, ca: str, name: str, san: str = "") -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=d)  # fmt: skip
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", f"{name}.crt", cwd=d)  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "rogue-ca")
    _leaf(d, "ca", "server", san="DNS:localhost,IP:127.0.0.1")
    _leaf(d, "ca", "researcher")
    _leaf(d, "rogue-ca", "impostor")
    return d


def _creds(d: Path, client: str | None) -> grpc.ChannelCredentials:
    root = (d / "ca.crt").read_bytes()
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=(d / f"{client}.key").read_bytes(),
        certificate_chain=(d / f"{client}.crt").read_bytes(),
    )


def test_client_certificate_names_the_agent(start_server: ServerFactory, pki: Path, user_id: str) -> None:
    policy = pki / "policy.yaml"
    policy.write_text(yaml.safe_dump({"agents": {"researcher": {"groups": ["research"]}}}))
    server = start_server(
        listen="127.0.0.1:0",
        auth_required=True,
        access_policy_file=str(policy),
        tls_cert_file=str(pki / "server.crt"),
        tls_key_file=str(pki / "server.key"),
        tls_client_ca_file=str(pki / "ca.crt"),
    )
    target = "localhost:" + server.target.rsplit(":", 1)[1]
    with memlane.Client(target, credentials=_creds(pki, "researcher"), timeout=10) as c:
        sid = c.create_session(user_id=user_id, topology=Topology.TOPOLOGY_DISTRIBUTED).session.session_id
        c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content=uuid.uuid4().hex)])
        (m,) = c.list_messages(session_id=sid).messages
        assert m.source_agent_id == "researcher"  # taken from the certificate, not from the request
    for client in (None, "impostor"):
        retry = memlane.RetryPolicy(max_attempts=1)
        with (
            memlane.Client(target, credentials=_creds(pki, client), timeout=3, retry=retry) as c,
            pytest.raises((memlane.UnavailableError, memlane.UnauthenticatedError)),
        ):
            c.get_session(session_id=sid)
