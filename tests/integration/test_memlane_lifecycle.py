"""The whole lifecycle on the high-level clients (issue 47, item 3), against a real sidecar: mem0's
``Memory`` operations (remember with a slot, get, get_all, update, delete, history) and a conversation's
(context on a conversation not created yet, close_session), sync and async alike, each with an unknown
id answered ``NotFoundError``. On 3af1f4b none of these methods existed, ``remember`` took no slot and
``context()`` on a new conversation was NOT_FOUND."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import memlane
from memlane import AsyncMemlane, Memlane, MemoryChangeReason, MemoryKind
from memlane_server.background import SidecarThread

R = MemoryChangeReason
UNKNOWN = "mem_never_stored"


def _ids() -> tuple[str, str]:
    return f"u-{uuid.uuid4().hex[:8]}", f"chat-{uuid.uuid4().hex[:8]}"


def test_a_memory_from_remember_to_delete(server: SidecarThread) -> None:
    """remember(slot=) supersedes the older value of the slot; get, get_all, update, history and delete
    each see the change the one before made; an unknown id is NotFoundError for every one of them."""
    user, _ = _ids()
    with Memlane(server.target, agent_id="support-bot") as m:
        porto = m.remember(user, "Lives in Porto, Portugal.", slot="location")
        berlin = m.remember(user, "Moved to Berlin last week.", slot="location")
        units = m.remember(user, "Wants metric units.", kind=MemoryKind.MEMORY_KIND_PREFERENCE)
        assert len({porto, berlin, units}) == 3

        got = m.get(user, berlin)
        assert (got.content, got.slot, got.kind) == (
            "Moved to Berlin last week.",
            "location",
            MemoryKind.MEMORY_KIND_FACT,
        )
        # The newer value of the slot is the one served; the older stays, retired, in its history.
        assert [x.memory_id for x in m.get_all(user)] == [units, berlin]
        assert [x.memory_id for x in m.get_all(user, kinds=[MemoryKind.MEMORY_KIND_PREFERENCE])] == [units]
        assert [v.reason for v in m.history(user, porto)] == [
            R.MEMORY_CHANGE_REASON_CREATE,
            R.MEMORY_CHANGE_REASON_SUPERSEDE,
        ]
        assert m.history(user, porto)[-1].memory.superseded_by == berlin

        edited = m.update(user, berlin, "Moved to Berlin-Mitte last week.", importance=0.9)
        assert (edited.content, edited.slot) == ("Moved to Berlin-Mitte last week.", "location")
        assert edited.importance == pytest.approx(0.9)
        assert m.get(user, berlin).content == "Moved to Berlin-Mitte last week."
        assert m.update(user, units, slot="units").slot == "units"  # only what is given changes
        assert m.get(user, units).content == "Wants metric units."
        versions = m.history(user, berlin)
        assert [v.reason for v in versions] == [R.MEMORY_CHANGE_REASON_CREATE, R.MEMORY_CHANGE_REASON_EDIT]
        assert [v.changed_by for v in versions] == ["support-bot", "support-bot"]
        assert versions[0].memory.content == "Moved to Berlin last week."  # as each change left it

        m.delete(user, berlin)
        with pytest.raises(memlane.NotFoundError):
            m.get(user, berlin)
        assert [x.memory_id for x in m.get_all(user)] == [units]
        assert berlin not in [h.memory.memory_id for h in m.search(user, "where does the user live?")]

        for call in (
            lambda: m.get(user, UNKNOWN),
            lambda: m.update(user, UNKNOWN, "anything"),
            lambda: m.delete(user, UNKNOWN),
            lambda: m.history(user, UNKNOWN),
            lambda: m.delete(user, berlin),  # deleted already
        ):
            with pytest.raises(memlane.NotFoundError):
                call()
        with pytest.raises(memlane.InvalidArgumentError, match="update_mask"):
            m.update(user, units)  # nothing to change
        with pytest.raises(ValueError, match="limit"):
            m.get_all(user, limit=0)
        assert m.get_all(f"{user}-nobody") == []

    # The whole-user view (a caller naming no agent) also sees a deleted memory's last version.
    with Memlane(server.target) as viewer:
        last = viewer.history(user, berlin)[-1]
        assert (last.reason, last.deleted) == (R.MEMORY_CHANGE_REASON_DELETE, True)
        assert viewer.history(user, UNKNOWN) == []


def test_get_all_and_history_page_through_to_their_limit(
    server: SidecarThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two items a page, get_all and history take three pages for five items, in the server's
    order, and stop at ``limit`` (one page of ListMemories is the control)."""
    user, _ = _ids()
    monkeypatch.setattr(memlane._requests, "PAGE_SIZE", 2)
    with Memlane(server.target, agent_id="support-bot") as m:
        texts = [
            "Has a cat named Miso.",
            "Drives a blue van.",
            "Plays the cello.",
            "Grows tomatoes.",
            "Reads sci-fi.",
        ]
        for text in texts:
            m.remember(user, text)
        caller = memlane.Caller(user_id=user, agent_id="support-bot")
        one_page = m.client.list_memories(caller=caller, page_size=50)
        assert len(one_page.memories) == 5 and not one_page.next_page_token
        assert m.client.list_memories(caller=caller, page_size=2).next_page_token  # pages there are
        assert [x.memory_id for x in m.get_all(user)] == [x.memory_id for x in one_page.memories]
        assert [x.memory_id for x in m.get_all(user, limit=3)] == [x.memory_id for x in one_page.memories[:3]]

        target = one_page.memories[0].memory_id
        for i in range(4):
            m.update(user, target, importance=0.1 * (i + 1))
        reasons = [v.reason for v in m.history(user, target)]
        assert reasons == [R.MEMORY_CHANGE_REASON_CREATE] + [R.MEMORY_CHANGE_REASON_EDIT] * 4
        assert len(m.history(user, target, limit=3)) == 3


def test_context_on_a_conversation_not_created_yet(server: SidecarThread) -> None:
    """The first turn of a new conversation: context(user_id=) creates the session for the user (as add
    does) and recalls what memlane holds about them; without user_id the NotFoundError says how. A session
    erased since it was created is created again."""
    user, sid = _ids()
    with Memlane(server.target, agent_id="support-bot", channel="web") as m:
        m.remember(user, "Prefers email over phone calls.", kind=MemoryKind.MEMORY_KIND_PREFERENCE)

        chat = m.context(sid, "how should we reach me?", user_id=user)
        assert chat[-1] == {"role": "user", "content": "how should we reach me?"}
        assert any(c["role"] == "system" and "Prefers email" in str(c.get("content")) for c in chat)
        session = m.client.get_session(session_id=sid).session
        assert (session.user_id, session.agent_id, session.channel) == (user, "support-bot", "web")
        # The conversation goes on as usual from there.
        assert [r.seq for r in m.add(user, sid, [{"role": "user", "content": "By email, please."}])] == [1]
        assert m.context(sid, "ok?")[-2:] == [
            {"role": "user", "content": "By email, please."},
            {"role": "user", "content": "ok?"},
        ]

        other = f"chat-{uuid.uuid4().hex[:8]}"
        with pytest.raises(memlane.NotFoundError, match=r"pass user_id= to context\(\)"):
            m.context(other, "hello")
        with pytest.raises(memlane.NotFoundError):
            m.client.get_session(session_id=other)  # nothing was created

        # Erased behind this client's back (it remembers the session as created): created again, once.
        with Memlane(server.target) as operator:
            operator.forget_user(user)
        assert m.context(sid, "still there?", user_id=user)[-1] == {"role": "user", "content": "still there?"}
        assert m.client.get_session(session_id=sid).session.message_count == 0


def test_close_session_ends_the_conversation(server: SidecarThread) -> None:
    user, sid = _ids()
    with Memlane(server.target, agent_id="support-bot") as m:
        m.add(user, sid, [{"role": "user", "content": "That is all, thanks."}])
        closed = m.close_session(sid)
        assert (closed.session_id, closed.status) == (sid, memlane.SessionStatus.SESSION_STATUS_CLOSED)
        assert m.close_session(sid).status == memlane.SessionStatus.SESSION_STATUS_CLOSED  # idempotent
        with pytest.raises(memlane.FailedPreconditionError):
            m.add(user, sid, [{"role": "user", "content": "One more thing."}])
        with pytest.raises(memlane.NotFoundError):
            m.close_session(f"chat-{uuid.uuid4().hex[:8]}")


def test_the_async_lifecycle(server: SidecarThread) -> None:
    """AsyncMemlane: the same operations, the same answers and the same NotFoundError."""
    user, sid = _ids()

    async def run() -> None:
        async with AsyncMemlane(server.target, agent_id="support-bot") as m:
            chat = await m.context(sid, "hi there", user_id=user)
            assert chat[-1] == {"role": "user", "content": "hi there"}
            with pytest.raises(memlane.NotFoundError, match="user_id="):
                await m.context(f"chat-{uuid.uuid4().hex[:8]}", "hi")

            old = await m.remember(user, "Works at a bakery in Lyon.", slot="employer")
            new = await m.remember(user, "Joined a bank in Geneva as an analyst.", slot="employer")
            assert (await m.get(user, new)).slot == "employer"
            assert [x.memory_id for x in await m.get_all(user)] == [new]
            edited = await m.update(user, new, "Joined a bank in Geneva as a senior analyst.")
            assert edited.content == "Joined a bank in Geneva as a senior analyst."
            assert [v.reason for v in await m.history(user, new)] == [
                R.MEMORY_CHANGE_REASON_CREATE,
                R.MEMORY_CHANGE_REASON_EDIT,
            ]
            assert (await m.history(user, old))[-1].reason == R.MEMORY_CHANGE_REASON_SUPERSEDE
            await m.delete(user, new)
            assert await m.get_all(user) == []

            closed = await m.close_session(sid)
            assert closed.status == memlane.SessionStatus.SESSION_STATUS_CLOSED
            for call in (
                m.get(user, UNKNOWN),
                m.update(user, UNKNOWN, "x"),
                m.delete(user, UNKNOWN),
                m.history(user, UNKNOWN),
                m.close_session(f"chat-{uuid.uuid4().hex[:8]}"),
            ):
                with pytest.raises(memlane.NotFoundError):
                    await call

    asyncio.run(run())
