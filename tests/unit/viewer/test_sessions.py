"""The viewer's login sessions end: after SESSION_TTL_S, when past MAX_SESSIONS the oldest is dropped,
and at once for a token the policy no longer holds (the HTTP round trip is
tests/integration/test_memory_viewer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from memlane_server.access.policy import PolicyFile
from memlane_server.errors import Unauthenticated
from memlane_server.observability.http_endpoint import HttpRequest
from memlane_server.viewer.access import COOKIE, MAX_SESSIONS, SESSION_TTL_S, ViewerAccess


def _request(cookie: str = "") -> HttpRequest:
    headers = {"cookie": cookie.partition(";")[0]} if cookie else {}
    return HttpRequest("GET", "/viewer/", "/viewer/", {}, headers, {}, "127.0.0.1")


@pytest.fixture()
def policy(tmp_path: Path) -> PolicyFile:
    path = tmp_path / "policy.yaml"
    path.write_text(
        yaml.safe_dump(
            {"tokens": [{"token": "adm", "agent": "ops"}], "agents": {"ops": {"roles": ["admin"]}}}
        )
    )
    return PolicyFile(path)


def test_a_session_ends_after_its_time(policy: PolicyFile) -> None:
    now = [1000.0]
    access = ViewerAccess(policy, auth_required=True, clock=lambda: now[0])
    cookie = access.sign_in(_request(), "adm", path="/viewer")
    assert cookie.startswith(f"{COOKIE}=") and "adm" not in cookie
    assert access.admit(_request(cookie)).token == "adm"  # positive control
    now[0] += SESSION_TTL_S - 1
    assert access.admit(_request(cookie)).token == "adm"
    now[0] += 1
    with pytest.raises(Unauthenticated):
        access.admit(_request(cookie))


def test_past_the_cap_the_oldest_session_ends(policy: PolicyFile) -> None:
    access = ViewerAccess(policy, auth_required=True)
    first = access.sign_in(_request(), "adm", path="/viewer")
    later = [access.sign_in(_request(), "adm", path="/viewer") for _ in range(MAX_SESSIONS)]
    with pytest.raises(Unauthenticated):
        access.admit(_request(first))
    assert all(access.admit(_request(c)).token == "adm" for c in later)
