"""The viewer as an operator uses it, in headless Chromium driven over DevTools (tests/chromium.py): find
a user by search, find a memory by text, edit it, merge two, follow a memory to the turn it came from,
follow a trace to a memory it injected. A screenshot of each step is saved ($MEMLANE_SCREENSHOTS, else
the test's temporary directory; as JPEG with MEMLANE_SCREENSHOTS_JPEG=1, how docs/images was made) and
its path printed."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import memlane
from memlane import MemoryKind, Message, Role
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from tests.chromium import Browser
from tests.conftest import ServerFactory

HOSTILE = '<b>bold</b> & "quotes"'


@pytest.fixture(scope="module")
def viewer(start_server: ServerFactory) -> SidecarThread:
    return start_server(admin_listen="127.0.0.1:0", viewer_enabled=True)


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Browser]:
    b = Browser(tmp_path / "profile")
    try:
        yield b
    finally:
        b.close()


SUFFIX = ".jpg" if os.environ.get("MEMLANE_SCREENSHOTS_JPEG") == "1" else ".png"


@pytest.fixture()
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("MEMLANE_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _seed(target: str) -> tuple[str, str, dict[str, str]]:
    """A user with a conversation, memories learned from its turns (two of them saying one thing) and a
    turn trace that injected one; (user, session, memory ids by name)."""
    user = f"ops-{uuid.uuid4().hex[:6]}@example.org"
    caller = mpb.Caller(user_id=user, agent_id="support-bot")
    with memlane.Client(target, timeout=30) as c:
        sid = c.create_session(user_id=user, agent_id="support-bot").session.session_id
        c.append_messages(
            session_id=sid,
            messages=[
                Message(message_id="t1", role=Role.ROLE_USER, content="My order 4417 arrived damaged."),
                Message(message_id="t2", role=Role.ROLE_ASSISTANT, content="Sorry! A replacement is coming."),
                Message(
                    message_id="t3", role=Role.ROLE_USER, content=f"Please email me, never call. {HOSTILE}"
                ),
            ],
        )

        def remember(content: str, kind: int, *source: str) -> str:
            return c.create_memory(
                caller=caller,
                kind=kind,  # type: ignore[arg-type]
                content=content,
                source_session_id=sid if source else "",
                source_message_ids=list(source),
            ).memory.memory_id

        ids = {
            "email": remember("Prefers email over phone calls.", MemoryKind.MEMORY_KIND_PREFERENCE, "t3"),
            "order": remember("Order 4417 arrived damaged.", MemoryKind.MEMORY_KIND_FACT, "t1"),
            "tea": remember("Drinks green tea in the morning.", MemoryKind.MEMORY_KIND_PREFERENCE),
            "tea2": remember("Likes a cup of sencha after waking up.", MemoryKind.MEMORY_KIND_PREFERENCE),
        }
        for _ in c.assemble_context(session_id=sid, user_input="can you email me about the order?"):
            pass
    return user, sid, ids


def test_an_operator_fixes_memory_in_the_browser(
    viewer: SidecarThread, browser: Browser, shots: Path
) -> None:
    user, sid, ids = _seed(viewer.target)
    base = f"http://127.0.0.1:{viewer.sidecar.admin_port}/viewer/"
    b = browser

    # Find a user by search (part of the id, another case).
    b.goto(base)
    b.fill("input[name=q]", user.split("@")[0].upper())
    b.click("form.filters button[type=submit]")
    assert user in b.text("table") and "Users matching" in b.text("h2")
    b.screenshot(shots / f"viewer-users{SUFFIX}")
    b.click(f"a[href$='{_seg(user)}/memories']")
    assert b.text("h1").startswith("Long-term memories of")

    # Find a memory by text (hybrid recall, the agent's own ranking).
    b.fill("input[name=q]", "how to contact them")
    b.click("form.filters button[type=submit]")
    rows = b.text("table")
    assert "Prefers email over phone calls." in rows and "score" in b.text("table tr")
    b.screenshot(shots / f"viewer-search{SUFFIX}")

    # Edit it: through UpdateMemory, so the history says what changed.
    b.click(f"a[href$='/memories/{ids['email']}']")
    b.fill("textarea[name=content]", "Prefers email; never phone calls.")
    b.fill("input[name=slot]", "contact_channel")
    b.click("form.edit button[type=submit]")
    assert "Prefers email; never phone calls." in b.text(".memory-content")
    history = b.text("table:last-of-type")
    assert "edit" in history and "create" in history
    b.screenshot(shots / f"viewer-memory{SUFFIX}")

    # Follow it to the turn it came from: the session page, scrolled to that turn and highlighted.
    b.click("a.turn")
    assert b.url.endswith("#m-t3") and "/sessions/" in b.url
    assert "Please email me, never call." in b.text("tr:target")
    assert "<b>bold</b>" in b.text("tr:target")  # hostile text shown as text, not markup
    assert b.js("document.querySelector('tr:target b')") is None
    b.screenshot(shots / f"viewer-source-turn{SUFFIX}")

    # Merge two memories that say one thing.
    b.goto(base + f"users/{_seg(user)}/memories")
    b.check(f"input[name=id][value='{ids['tea']}']")
    b.check(f"input[name=id][value='{ids['tea2']}']")
    b.click("form[action$='/merge'] button[type=submit]")
    assert "Merge 2 memories" in b.text("h1")
    b.screenshot(shots / f"viewer-merge{SUFFIX}")
    b.check(f"input[name=keep][value='{ids['tea']}']")
    b.fill("textarea[name=content]", "Drinks green tea (sencha) every morning.")
    b.click("button.danger")
    assert f"/memories/{ids['tea']}" in b.url
    assert "Drinks green tea (sencha) every morning." in b.text(".memory-content")
    assert ids["tea2"] in b.text("body")  # the supersede chain names the merged-away memory
    with memlane.Client(viewer.target) as c:
        gone = c.get_memory(caller=mpb.Caller(user_id=user), memory_id=ids["tea2"]).memory
        assert gone.superseded_by == ids["tea"]

    # Follow a trace to a memory it injected.
    b.goto(base + f"sessions/{_seg(sid)}")
    b.click("a[href*='/traces/']")
    assert "What the model saw" in b.text("h1")
    b.screenshot(shots / f"viewer-trace{SUFFIX}")
    injected = b.js("[...document.querySelectorAll('a[href*=\"/memories/\"]')].map(a => a.href)")
    assert injected, "the trace links no memory"
    b.click("a[href*='/memories/']")
    assert b.text("h1").startswith("Memory ")
    assert "Injected into (1)" in b.text("body")  # and back: the memory lists the trace
    print(f"viewer screenshots: {shots}")


def test_the_edit_and_merge_forms_need_the_form_token(viewer: SidecarThread, browser: Browser) -> None:
    """Every action behind CSRF: a form posted without the viewer's token changes nothing."""
    user, _, ids = _seed(viewer.target)
    base = f"http://127.0.0.1:{viewer.sidecar.admin_port}/viewer/"
    browser.goto(base + f"users/{_seg(user)}/memories/{ids['order']}")
    browser.fill("input[name=csrf]", "0" * 64)
    browser.fill("textarea[name=content]", "Forged.")
    browser.click("form.edit button[type=submit]")
    assert "stale" in browser.text("body")
    with memlane.Client(viewer.target) as c:
        kept = c.get_memory(caller=mpb.Caller(user_id=user), memory_id=ids["order"]).memory
        assert kept.content == "Order 4417 arrived damaged."


def _seg(text: str) -> str:
    from urllib.parse import quote  # noqa: PLC0415

    return quote(text, safe="")
