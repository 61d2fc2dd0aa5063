"""ForgetUser erases a user's data stored under any canonically equal form of the id: requests carry ids
in NFC, but rows written before that (an import that kept a file's NFD id, an older sidecar that stored
ids as sent) hold the decomposed form. Such rows are planted here through the lower layer, the way an
older version wrote them (a session document in the sidecar's own store, a LanceDB row), then erased
through the real server; the byte scan of Redis, LanceDB and the archive proves nothing is left. An
export before finds them all (ExportUserData reads the forms erasure erases).
"""

from __future__ import annotations

import asyncio
import json
import unicodedata
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2
from memlane_server.background import SidecarThread
from memlane_server.ltm import MemoryItem, MemoryKind, MemoryScope, filters
from memlane_server.sessions.model import Session
from tests.conftest import ServerFactory
from tests.integration.test_user_data import _archive_text, _files_holding, _redis_bytes

T = TypeVar("T")


def _in_sidecar(sidecar: SidecarThread, work: Coroutine[Any, Any, T]) -> T:
    """Runs ``work`` on the sidecar's own event loop (its stores belong to that loop)."""
    return asyncio.run_coroutine_threadsafe(work, sidecar._loop).result(60)


def _listed(c: memlane.Client, tag: str) -> set[str]:
    return {u.user_id for u in c.list_users(query=tag).users}


def test_forget_user_erases_rows_stored_under_the_decomposed_form(
    start_server: ServerFactory, tmp_path: Path, redis_url: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    nfc = f"Jos\u00e9-{tag}"  # é as one code point: the form every request is normalized to
    nfd = unicodedata.normalize("NFD", nfc)  # e + U+0301: the form a legacy row holds
    assert nfd != nfc and nfd.encode() not in nfc.encode()
    mark_old, mark_row, mark_new = (f"{w}{uuid.uuid4().hex[:10]}" for w in ("okapi", "tapir", "quokka"))
    data = tmp_path / "data"
    sidecar = start_server(data_dir=str(data))
    prefix = sidecar.settings.redis.key_prefix
    # The compatibility form is another user (the sidecar keeps "ﬁ" and "fi" apart): never erased with it.
    ligature, plain = f"\ufb01le-{tag}", f"file-{tag}"
    with memlane.Client(sidecar.target, timeout=120) as c:
        for user in (ligature, plain):
            c.create_memory(
                caller=memory_pb2.Caller(user_id=user),
                content=f"The user {user} keeps bees.",
                kind=memory_pb2.MEMORY_KIND_FACT,
            )
        # Legacy rows: a session document under the NFD id (its turns, archive and promoted memories
        # then follow it), and a memory row written straight into the table.
        legacy, _ = _in_sidecar(sidecar, sidecar.sidecar.sessions.create(Session(session_id="", user_id=nfd)))
        c.append_messages(
            session_id=legacy.session_id,
            messages=[
                Message(role=Role.ROLE_USER, content=f"My locker code is {mark_old}. I live in Lisbon."),
                Message(role=Role.ROLE_ASSISTANT, content=f"Noted, {mark_old}."),
            ],
        )
        c.promote_session(session_id=legacy.session_id, close=True, timeout=120)
        row = MemoryItem(
            id=f"legacy-{tag}",
            user_id=nfd,
            agent_id="",
            scope=MemoryScope.USER,
            kind=MemoryKind.FACT,
            content=f"The user's bicycle is called {mark_row}.",
            vector=[0.01] * 384,
        )
        ltm = sidecar.sidecar.ltm
        assert ltm is not None
        _in_sidecar(sidecar, ltm.store.add([row]))
        # And the user's current data, through the API (stored in NFC).
        c.create_memory(
            caller=memory_pb2.Caller(user_id=nfc),
            content=f"The user's kite is called {mark_new}.",
            kind=memory_pb2.MEMORY_KIND_FACT,
        )

        # Positive controls: every form and marker is stored, the legacy form is listed.
        redis_bytes = _redis_bytes(redis_url, prefix)
        assert nfd.encode() in redis_bytes and mark_old.encode() in redis_bytes
        for needle in (nfd, nfc, mark_row, mark_new, mark_old):
            assert _files_holding(data / "ltm", needle.encode()), needle
        as_json = json.dumps(nfd)[1:-1]  # how _archive_text writes the id
        assert mark_old in _archive_text(data / "archive") and as_json in _archive_text(data / "archive")
        assert {nfd, nfc, ligature, plain} <= _listed(c, tag)

        exported = b"".join(r.data for r in c.export_user_data(user_id=nfc))  # every form, as erasure
        assert all(m.encode() in exported for m in (mark_old, mark_row, mark_new)), exported[:2000]

        receipt = c.forget_user(user_id=nfc)
        assert receipt.erased["redis.sessions"] == 1 and receipt.erased["lancedb.items"] >= 3
        assert receipt.erased["archive.files"] >= 1

        redis_bytes = _redis_bytes(redis_url, prefix)
        for needle in (nfd, nfc, mark_old, mark_row, mark_new):
            assert needle.encode() not in redis_bytes, needle
        for form in (nfd, nfc):
            for raw in (form.encode(), filters.key(form).encode()):
                assert _files_holding(data / "ltm", raw) == [], raw
        for needle in (mark_old, mark_row, mark_new):
            assert _files_holding(data / "ltm", needle.encode()) == [], needle
            assert needle not in _archive_text(data / "archive")
            assert _files_holding(data / "archive", needle.encode()) == [], needle
        assert as_json not in _archive_text(data / "archive")
        assert _listed(c, tag) == {ligature, plain}
        assert all(v == 0 for v in c.forget_user(user_id=nfd).erased.values())  # either form: done

        # The compatibility form is erased alone, as the other user it is.
        c.forget_user(user_id=ligature)
        facts = c.get_profile(caller=memory_pb2.Caller(user_id=plain)).facts
        assert [m.content for m in facts] == [f"The user {plain} keeps bees."]
        assert _listed(c, tag) == {plain}
