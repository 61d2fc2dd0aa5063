"""ForgetUser drops every in-process copy of the user's data, down to the ids that key them: the
per-user LTM version view, the in-memory recall index and the per-message token recounts (the user id
and session ids are the user's data too)."""

from __future__ import annotations

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from memlane_server.context.sources import LtmMemorySource


def test_forget_user_drops_the_in_process_entries_keyed_by_the_user(
    server: SidecarThread, client: memlane.Client, user_id: str
) -> None:
    sid = client.create_session(user_id=user_id, model="gpt-4").session.session_id
    client.append_messages(
        session_id=sid, messages=[Message(role=Role.ROLE_USER, content="I keep bees on the roof.")]
    )
    # A memory to recall: for a user with none visible, assembly skips recall (and its index) entirely.
    client.create_memory(
        caller=mpb.Caller(user_id=user_id), kind=mpb.MEMORY_KIND_FACT, content="User keeps bees."
    )
    # A model of another encoding than the session's makes assembly recount (and remember) the turns;
    # recall reads (and remembers) the user's LTM version.
    list(client.assemble_context(session_id=sid, user_input="what do I keep?", model="gpt-4o"))
    # Again: the first assembly after a version change does not keep the recall index entry it loads
    # (the profile read, concurrent with it, saw the new version too and dropped the user's entries).
    list(client.assemble_context(session_id=sid, user_input="what else do I keep?", model="gpt-4o"))
    context = server.sidecar.context
    assert context is not None
    recounts = context._history._recounts
    memory = context._memory
    assert isinstance(memory, LtmMemorySource)
    ltm = server.sidecar.ltm
    assert ltm is not None
    seen = ltm.freshness._seen  # the versions this process's view was current with (ltm/core.py)
    assert any(k[0] == sid for k in recounts) and user_id in seen  # positive control
    assert ltm.hot_index.holds(user_id)  # recall loaded the user's in-memory index entry
    client.forget_user(user_id=user_id)
    assert not any(k[0] == sid for k in recounts)
    assert user_id not in seen
    assert not ltm.hot_index.holds(user_id)
