"""The memory viewer on the admin port, against a real sidecar: each page over HTTP (content, escaping of
hostile strings, delete and wipe behind CSRF and a confirmation, access rules), then every page loaded by
headless Chromium with a screenshot saved per page."""

from __future__ import annotations

import hashlib
import http.client
import re
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
import yaml

import memlane
from memlane import MemoryKind, Message, Role
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from tests.chromium import chromium
from tests.conftest import ServerFactory

HOSTILE = "<script>alert('x')</script> & \"quotes\""


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: str


def request(
    port: int, path: str, *, form: dict[str, str] | None = None, headers: dict[str, str] | None = None,
    host: str = "127.0.0.1",
) -> Reply:  # fmt: skip
    conn = http.client.HTTPConnection(host, port, timeout=30)
    body = urlencode(form) if form is not None else None
    hdrs = dict(headers or {})
    if body is not None:
        hdrs["Content-Type"] = "application/x-www-form-urlencoded"
    conn.request("POST" if form is not None else "GET", path, body=body, headers=hdrs)
    r = conn.getresponse()
    out = Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode())
    conn.close()
    return out


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


@dataclass
class Seeded:
    port: int
    user: str
    open_sid: str
    closed_sid: str
    trace_id: str
    memory_id: str
    parts: mpb.ScoreParts  # of the memory block's recalled memory, read back through GetTurnTrace


@pytest.fixture(scope="module")
def viewer(start_server: ServerFactory) -> SidecarThread:
    return start_server(admin_listen="127.0.0.1:0", viewer_enabled=True)


@pytest.fixture(scope="module")
def seeded(viewer: SidecarThread) -> Seeded:
    user = f"u:{uuid.uuid4().hex[:6]}@example.org"  # characters a URL must encode
    with memlane.Client(viewer.target, timeout=30) as c:
        open_sid = c.create_session(user_id=user, agent_id="support-bot").session.session_id
        closed_sid = c.create_session(user_id=user, agent_id="support-bot").session.session_id
        c.append_messages(
            session_id=open_sid,
            messages=[
                Message(role=Role.ROLE_USER, content=f"My order 4417 arrived damaged. {HOSTILE}"),
                Message(role=Role.ROLE_ASSISTANT, content="Sorry! A replacement is on its way."),
            ],
        )
        c.close_session(session_id=closed_sid)
        memory_id = c.create_memory(
            caller=mpb.Caller(user_id=user, agent_id="support-bot"),
            kind=MemoryKind.MEMORY_KIND_PREFERENCE,
            content="Prefers email over phone calls.",
        ).memory.memory_id
        stats = None
        # Without the profile section: a memory the profile injects is not repeated among the recalled.
        for item in c.assemble_context(
            session_id=open_sid, user_input="how do I contact them by email?", omit=[cpb.PROVENANCE_PROFILE]
        ):
            if item.HasField("stats"):
                stats = item.stats
        assert stats is not None
        trace = c.get_turn_trace(session_id=open_sid, trace_id=stats.trace_id).trace
    recalled = [
        m for b in trace.blocks if b.provenance == cpb.PROVENANCE_MEMORY for m in b.memories
    ]  # fmt: skip
    assert [m.memory_id for m in recalled] == [memory_id] and recalled[0].HasField("parts")
    return Seeded(
        viewer.sidecar.admin_port or 0,
        user,
        open_sid,
        closed_sid,
        stats.trace_id,
        memory_id,
        recalled[0].parts,
    )


def seg(*parts: str) -> str:
    return "/viewer/" + "/".join(quote(p, safe="") for p in parts)


def test_off_unless_enabled(start_server: ServerFactory) -> None:
    plain = start_server(admin_listen="127.0.0.1:0")
    assert request(plain.sidecar.admin_port or 0, "/viewer/").status == 404
    assert request(plain.sidecar.admin_port or 0, "/healthz").status == 200  # the port does answer


def test_pages_over_http(seeded: Seeded) -> None:
    port = seeded.port
    index = request(port, "/viewer/")
    assert index.status == 200 and 'name="user"' in index.body
    assert (
        "Content-Security-Policy" in {k.title() for k in index.headers}
        or "content-security-policy" in index.headers
    )
    jump = request(port, "/viewer/?" + urlencode({"user": seeded.user}))
    assert jump.status == 303 and jump.headers["location"] == seg("users", seeded.user)

    user = request(port, seg("users", seeded.user))
    assert user.status == 200
    assert seeded.open_sid in user.body and seeded.closed_sid in user.body
    assert re.search(r'class="status-active">active<', user.body)
    assert re.search(r'class="status-closed">closed<', user.body)

    session = request(port, seg("sessions", seeded.open_sid))
    assert session.status == 200
    assert "My order 4417 arrived damaged." in session.body
    assert "&lt;script&gt;" in session.body and "<script>" not in session.body
    assert seeded.trace_id in session.body

    trace = request(port, seg("sessions", seeded.open_sid, "traces", seeded.trace_id))
    assert trace.status == 200
    for provenance in ("system", "memory", "conversation"):
        assert f"<h3>{provenance} · " in trace.body
    assert "Prefers email over phone calls." in trace.body and seeded.memory_id in trace.body
    assert re.search(r"\d+ tokens \(cap \d+\)", trace.body)
    # The recalled memory's score parts, as the trace keeps them (GetTurnTrace), are on the page.
    parts = seeded.parts
    assert parts.vector_rank == 1 and parts.vector_similarity > 0.1 and parts.final > 0
    shown = f"vector #{parts.vector_rank} ({parts.vector_similarity:.3f})"
    assert shown in trace.body, shown
    assert f"final {parts.final:.4f}" in trace.body and f"fused {parts.fused:.3f}" in trace.body

    assert request(port, seg("sessions", "no-such-session")).status == 404
    assert request(port, "/viewer/nowhere").status == 404


def test_delete_a_memory_needs_the_form_token(seeded: Seeded) -> None:
    port = seeded.port
    page = request(port, seg("users", seeded.user, "memories"))
    assert page.status == 200 and "Prefers email over phone calls." in page.body and "preference" in page.body
    action = seg("users", seeded.user, "memories", seeded.memory_id, "delete")
    assert action in page.body  # each memory links to its delete page, which asks first
    confirm = request(port, action)
    assert confirm.status == 200 and "Delete this memory" in confirm.body and "Prefers email" in confirm.body
    forged = request(port, action, form={"csrf": "0" * 64})
    assert forged.status == 403
    assert "Prefers email" in request(port, seg("users", seeded.user, "memories")).body  # still there
    done = request(port, action, form={"csrf": csrf_of(confirm.body)})
    assert done.status == 303 and done.headers["location"] == seg("users", seeded.user, "memories")
    assert "Prefers email" not in request(port, seg("users", seeded.user, "memories")).body


def test_wipe_user_behind_a_confirmation(viewer: SidecarThread) -> None:
    port = viewer.sidecar.admin_port or 0
    user = f"wipe-{uuid.uuid4().hex[:6]}"
    with memlane.Client(viewer.target, timeout=30) as c:
        sid = c.create_session(user_id=user).session.session_id
    confirm = request(port, seg("users", user, "wipe"))
    assert confirm.status == 200 and "cannot be undone" in confirm.body
    wrong = request(
        port, seg("users", user, "wipe"), form={"csrf": csrf_of(confirm.body), "confirm": "someone"}
    )
    assert wrong.status == 400 and "nothing was erased" in wrong.body
    assert sid in request(port, seg("users", user)).body  # positive control: still there
    done = request(port, seg("users", user, "wipe"), form={"csrf": csrf_of(confirm.body), "confirm": user})
    assert done.status == 200 and "Erased" in done.body and "redis.sessions" in done.body
    assert sid not in request(port, seg("users", user)).body


def _lan_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_loopback_only_without_auth(start_server: ServerFactory) -> None:
    lan = _lan_address()
    if lan is None:
        pytest.skip("this machine has no non-loopback address")
    sidecar = start_server(admin_listen="0.0.0.0:0", viewer_enabled=True)
    port = sidecar.sidecar.admin_port or 0
    assert request(port, "/viewer/").status == 200  # loopback
    refused = request(port, "/viewer/", host=lan)
    assert refused.status == 403 and "loopback" in refused.body
    assert request(port, "/healthz", host=lan).status == 200  # the same path from the same peer works


def test_admin_token_when_auth_is_on(start_server: ServerFactory, tmp_path: Path) -> None:
    admin, agent = f"tok-admin-{uuid.uuid4().hex[:6]}", f"tok-agent-{uuid.uuid4().hex[:6]}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "tokens": [
                    {"sha256": hashlib.sha256(admin.encode()).hexdigest(), "agent": "ops"},
                    {"sha256": hashlib.sha256(agent.encode()).hexdigest(), "agent": "bot"},
                ],
                "agents": {"ops": {"roles": ["admin", "auditor"]}},
            }
        )
    )
    sidecar = start_server(
        admin_listen="127.0.0.1:0", viewer_enabled=True, auth_required=True, access_policy_file=str(policy)
    )
    port = sidecar.sidecar.admin_port or 0
    anonymous = request(port, "/viewer/")
    assert anonymous.status == 303 and anonymous.headers["location"] == "/viewer/login"
    assert request(port, "/viewer/", headers={"Authorization": f"Bearer {agent}"}).status == 403
    assert request(port, "/viewer/", headers={"Authorization": "Bearer nope"}).status == 303
    assert request(port, "/viewer/login", form={"token": agent}).status == 401
    login = request(port, "/viewer/login", form={"token": admin})
    assert login.status == 303
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    with memlane.Client(sidecar.target, token=agent, timeout=30) as c:
        sid = c.create_session(user_id="alice").session.session_id
    page = request(port, seg("users", "alice"), headers={"Cookie": cookie.split(";")[0]})
    assert page.status == 200 and sid in page.body


def test_the_login_cookie_is_a_session_value_not_the_token(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    """The login form's cookie was the raw admin token (a leaked cookie was the gRPC credential, for
    ever) and never ``Secure``. Now it is a random session value mapped to the token in the sidecar,
    ending after a working day; the raw token is no cookie; ``Secure`` when a TLS proxy served the
    page. Positive control: the session cookie opens the viewer, the Authorization header still works."""
    admin = f"tok-admin-{uuid.uuid4().hex[:6]}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "tokens": [{"sha256": hashlib.sha256(admin.encode()).hexdigest(), "agent": "ops"}],
                "agents": {"ops": {"roles": ["admin"]}},
            }
        )
    )
    sidecar = start_server(
        admin_listen="127.0.0.1:0", viewer_enabled=True, auth_required=True, access_policy_file=str(policy)
    )
    port = sidecar.sidecar.admin_port or 0
    plain = request(port, "/viewer/login", form={"token": admin}).headers["set-cookie"]
    again = request(port, "/viewer/login", form={"token": admin}).headers["set-cookie"]
    attributes = [a.strip() for a in plain.split(";")]
    name, _, value = attributes[0].partition("=")
    assert admin not in plain and len(value) >= 40 and value != again.split(";")[0].partition("=")[2]
    assert {"HttpOnly", "SameSite=Strict", "Path=/viewer", "Max-Age=28800"} <= set(attributes)
    assert "Secure" not in attributes  # served over plain HTTP: a Secure cookie would not be kept
    assert request(port, "/viewer/", headers={"Cookie": f"{name}={value}"}).status == 200
    assert request(port, "/viewer/", headers={"Authorization": f"Bearer {admin}"}).status == 200
    for forged in (admin, value[:-2] + "xx"):  # the token itself, or a guessed value: back to the login
        refused = request(port, "/viewer/", headers={"Cookie": f"{name}={forged}"})
        assert refused.status == 303 and refused.headers["location"] == "/viewer/login"
    refused = request(port, "/viewer/", headers={"Cookie": f"memlane_viewer_token={admin}"})  # the old cookie
    assert refused.status == 303
    behind_tls = request(
        port, "/viewer/login", form={"token": admin}, headers={"X-Forwarded-Proto": "https"}
    ).headers["set-cookie"]
    assert "Secure" in [a.strip() for a in behind_tls.split(";")]


# ------------------------------------------------------------------------------------------ browser


def browse(tool: str, url: str, profile: Path, *, screenshot: Path | None = None) -> str:
    args = [
        tool,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    out = subprocess.run([*args, url], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_every_page_in_a_browser(seeded: Seeded, tmp_path: Path) -> None:
    tool = chromium()
    base = f"http://127.0.0.1:{seeded.port}"
    pages = {
        "index": ("/viewer/", "Memory viewer"),
        "user": (seg("users", seeded.user), seeded.closed_sid),
        "session": (seg("sessions", seeded.open_sid), "My order 4417 arrived damaged."),
        "trace": (seg("sessions", seeded.open_sid, "traces", seeded.trace_id), "What the model saw"),
        "memories": (seg("users", seeded.user, "memories"), "Long-term memories of"),
        "wipe": (seg("users", seeded.user, "wipe"), "cannot be undone"),
    }
    shots = tmp_path / "screenshots"
    shots.mkdir()
    for name, (path, expected) in pages.items():
        dom = browse(tool, base + path, tmp_path / "profile")
        assert expected in dom, f"{name}: {expected!r} not rendered"
        assert "<script>alert" not in dom  # hostile content stays text
        shot = shots / f"{name}.png"
        browse(tool, base + path, tmp_path / "profile", screenshot=shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000, name
    print(f"viewer screenshots: {shots}")


def test_without_auth_a_rebound_host_name_is_refused(seeded: Seeded) -> None:
    """DNS rebinding: a web page on evil.example re-points its name at 127.0.0.1, so the browser on the
    operator's machine reaches the loopback viewer from the page's own origin and can read every user's
    data and the form token. Only loopback host names are served with auth off."""
    port = seeded.port
    for host in ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):  # positive controls
        ok = request(port, seg("users", seeded.user), headers={"Host": host})
        assert ok.status == 200 and seeded.open_sid in ok.body, host
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        page = request(port, seg("users", seeded.user), headers={"Host": host})
        assert page.status == 403 and seeded.open_sid not in page.body, host
        wipe = request(
            port, seg("users", seeded.user, "wipe"), form={"csrf": "0" * 64, "confirm": seeded.user}
        )
        assert wipe.status == 403, host
    assert seeded.open_sid in request(port, seg("users", seeded.user)).body  # nothing was wiped


def test_a_trace_page_names_the_memories_it_left_out(viewer: SidecarThread) -> None:
    """ "Left out of memory: below the relevance floor (… 1 items)" must say which: the trace (GetTurnTrace)
    and its page name each memory a rule left out, linked to the memory's page."""
    user = f"u-{uuid.uuid4().hex[:8]}"
    who = mpb.Caller(user_id=user, agent_id="support-bot")
    with memlane.Client(viewer.target, timeout=30) as c:
        dog, vim = (
            c.create_memory(caller=who, kind=MemoryKind.MEMORY_KIND_EPISODIC, content=text).memory.memory_id
            for text in (
                "[2 May 2024] User: my dog Rex chewed both of my slippers last night.",
                "[3 May 2024] User: I switched my editor to Vim keybindings this week.",
            )
        )
        sid = c.create_session(user_id=user, agent_id="support-bot").session.session_id
        stats = None
        for item in c.assemble_context(session_id=sid, user_input="which keybindings does my editor use?"):
            if item.HasField("stats"):
                stats = item.stats
        assert stats is not None
        trace = c.get_turn_trace(session_id=sid, trace_id=stats.trace_id).trace
    weak = [t for t in trace.stats.truncations if "relevance floor" in t.reason]
    assert [list(t.memory_ids) for t in weak] == [[dog]], trace.stats.truncations
    injected = [
        m.memory_id for b in trace.blocks if b.provenance == cpb.PROVENANCE_MEMORY for m in b.memories
    ]
    assert injected == [vim]  # positive control: the relevant one went in
    page = request(viewer.sidecar.admin_port or 0, seg("sessions", sid, "traces", stats.trace_id))
    assert page.status == 200
    (line,) = re.findall(r'<p class="truncated">Left out of[^<]*relevance floor.*?</p>', page.body, re.S)
    assert dog in line and vim not in line, line
