"""The operator RPCs of issue 32 through the real server and client: ListUsers (search, paging, rights),
MergeMemories (provenance, supersede, history, erasure) and the export format that ImportUserData reads
back into another sidecar (the same recall and the same assembled context)."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import orjson
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import memlane
from memlane import Message, Role
from memlane.v1 import admin_pb2 as apb
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import procedure_pb2 as ppb
from memlane_server.background import SidecarThread
from tests.conftest import ServerFactory
from tests.hostile import hostile_ids


def _user(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def _all_users(c: memlane.Client, query: str, page_size: int) -> list[apb.UserSummary]:
    return list(
        memlane.iter_pages(lambda t: c.list_users(query=query, page_size=page_size, page_token=t), "users")
    )


def test_list_users_search_and_paging(client: memlane.Client) -> None:
    tag = uuid.uuid4().hex[:8]
    with_sessions = [f"Lister-{tag}-{i}" for i in range(3)]
    for u in with_sessions:
        client.create_session(user_id=u)
    client.create_session(user_id=with_sessions[0])
    only_memory = f"lister-{tag}-mem"  # no session at all: found through long-term memory
    client.create_memory(
        caller=mpb.Caller(user_id=only_memory), kind=mpb.MEMORY_KIND_FACT, content="Keeps two cats."
    )
    first = client.list_users(query=f"LISTER-{tag}", page_size=2)
    assert first.total_size == 4 and len(first.users) == 2 and first.next_page_token
    found = _all_users(client, f"lister-{tag}", 2)
    assert [u.user_id for u in found] == sorted([*with_sessions, only_memory])
    by_id = {u.user_id: u for u in found}
    assert by_id[with_sessions[0]].session_count == 2 and by_id[with_sessions[0]].last_session_at_unix_ms > 0
    assert by_id[only_memory].memory_count == 1 and by_id[only_memory].session_count == 0
    assert client.list_users(query=f"nobody-{tag}").users == []  # positive control above: the query narrows
    with pytest.raises(memlane.InvalidArgumentError, match="page_token"):
        client.list_users(query=f"other-{tag}", page_token=first.next_page_token)  # a token of another query
    with pytest.raises(memlane.InvalidArgumentError, match="query"):
        client.list_users(query="x" * 129)
    client.forget_user(user_id=only_memory)
    assert only_memory not in {u.user_id for u in _all_users(client, f"lister-{tag}", 50)}


def test_list_users_needs_admin_or_auditor(start_server: ServerFactory, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    tokens = {name: f"tok-{name}-{uuid.uuid4().hex[:6]}" for name in ("ops", "aud", "bot")}
    policy.write_text(
        yaml.safe_dump(
            {
                "tokens": [
                    {"sha256": hashlib.sha256(t.encode()).hexdigest(), "agent": name}
                    for name, t in tokens.items()
                ],
                "agents": {"ops": {"roles": ["admin"]}, "aud": {"roles": ["auditor"]}},
            }
        )
    )
    secured = start_server(auth_required=True, access_policy_file=str(policy))
    user = _user("rights")
    with memlane.Client(secured.target, token=tokens["bot"], timeout=30) as bot:
        bot.create_session(user_id=user)
        with pytest.raises(memlane.PermissionDeniedError, match="admin or auditor"):
            bot.list_users()
        with pytest.raises(memlane.PermissionDeniedError):
            bot.merge_memories(caller=mpb.Caller(user_id=user, agent_id="aud"), memory_ids=["a", "b"])
        with pytest.raises(memlane.PermissionDeniedError, match="admin role"):
            bot.import_user_data(data=b"{}")
    for name in ("ops", "aud"):
        with memlane.Client(secured.target, token=tokens[name], timeout=30) as c:
            assert user in {u.user_id for u in c.list_users(query=user).users}, name


def _memory(c: memlane.Client, user: str, content: str, **fields: object) -> mpb.Memory:
    return c.create_memory(caller=mpb.Caller(user_id=user), content=content, **fields).memory  # type: ignore[arg-type]


def test_merge_memories(client: memlane.Client, user_id: str) -> None:
    caller = mpb.Caller(user_id=user_id)
    sid = client.create_session(user_id=user_id).session.session_id
    a = _memory(
        client,
        user_id,
        "Drinks coffee black.",
        kind=mpb.MEMORY_KIND_PREFERENCE,
        source_session_id=sid,
        source_message_ids=["m1"],
        keywords=["coffee"],
    )
    b = _memory(
        client,
        user_id,
        "Takes no sugar or milk in hot drinks.",
        kind=mpb.MEMORY_KIND_PREFERENCE,
        source_message_ids=["m7", "m8"],
        importance=0.9,
    )
    untouched = _memory(client, user_id, "Owns a red bicycle.", kind=mpb.MEMORY_KIND_FACT)
    merged = client.merge_memories(
        caller=caller, memory_ids=[a.memory_id, b.memory_id], content="Drinks coffee black, no sugar."
    )
    assert merged.memory.memory_id == a.memory_id and list(merged.superseded_ids) == [b.memory_id]
    m = merged.memory
    assert m.content == "Drinks coffee black, no sugar." and m.source_session_id == sid
    assert list(m.source_message_ids) == ["m1", "m7", "m8"] and abs(m.importance - 0.9) < 1e-6
    old = client.get_memory(caller=caller, memory_id=b.memory_id).memory
    assert old.superseded_by == a.memory_id and old.valid_until_unix_ms > 0
    # Recall serves the merged item, never the superseded one; the item left out of the merge stays.
    hits = client.search_memories(caller=caller, query="sugar in coffee", limit=10).results
    ids = [h.memory.memory_id for h in hits]
    assert a.memory_id in ids and b.memory_id not in ids
    assert client.get_memory(caller=caller, memory_id=untouched.memory_id).memory.superseded_by == ""
    versions = client.list_memory_versions(caller=caller, page_size=100).versions
    reasons = [(v.memory_id, v.reason) for v in versions]
    assert (a.memory_id, mpb.MEMORY_CHANGE_REASON_MERGE) in reasons
    assert (b.memory_id, mpb.MEMORY_CHANGE_REASON_SUPERSEDE) in reasons
    # A retry answers the same; merging a retired item, or too few, is refused with the field named.
    again = client.merge_memories(caller=caller, memory_ids=[a.memory_id, b.memory_id])
    assert again.memory.memory_id == a.memory_id and list(again.superseded_ids) == [b.memory_id]
    with pytest.raises(memlane.InvalidArgumentError, match="retired"):
        client.merge_memories(caller=caller, memory_ids=[untouched.memory_id, b.memory_id])
    with pytest.raises(memlane.InvalidArgumentError, match="between 2"):
        client.merge_memories(caller=caller, memory_ids=[a.memory_id])
    with pytest.raises(memlane.InvalidArgumentError, match="twice"):
        client.merge_memories(caller=caller, memory_ids=[a.memory_id, a.memory_id])
    with pytest.raises(memlane.NotFoundError):
        client.merge_memories(
            caller=mpb.Caller(user_id=_user("other")), memory_ids=[a.memory_id, b.memory_id]
        )
    with pytest.raises(memlane.InvalidArgumentError, match="memory_ids\\[1\\]"):
        client.merge_memories(caller=caller, memory_ids=[a.memory_id, "bad{id}"])
    # Erasure takes the merged item and the superseded one with it.
    client.forget_user(user_id=user_id)
    everything = client.list_memories(caller=caller, filter=mpb.MemoryFilter(include_retired=True))
    assert everything.memories == [] and everything.total_size == 0


def _export(c: memlane.Client, user: str) -> bytes:
    return b"".join(r.data for r in c.export_user_data(user_id=user))


def _context(c: memlane.Client, sid: str, question: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for item in c.assemble_context(session_id=sid, user_input=question):
        out += [(b.provenance, b.rendered_text) for b in item.blocks]
    return out


def _seed(c: memlane.Client, user: str) -> str:
    sid = c.create_session(user_id=user, agent_id="support-bot").session.session_id
    c.append_messages(
        session_id=sid,
        messages=[
            Message(role=Role.ROLE_USER, content="My order 4417 arrived damaged."),
            Message(role=Role.ROLE_ASSISTANT, content="Sorry! A replacement ships on Monday."),
            Message(role=Role.ROLE_USER, content="Please use the back door for deliveries."),
        ],
    )
    caller = mpb.Caller(user_id=user)
    _memory(
        c, user, "Prefers email over phone calls.", kind=mpb.MEMORY_KIND_PREFERENCE, source_session_id=sid
    )
    first = _memory(c, user, "Lives in Berlin.", kind=mpb.MEMORY_KIND_FACT, slot="home_city")
    _memory(c, user, "Lives in Munich.", kind=mpb.MEMORY_KIND_FACT, slot="home_city")  # supersedes Berlin
    _memory(c, user, "Has a dog named Rex.", kind=mpb.MEMORY_KIND_FACT, source_message_ids=["m-rex"])
    c.create_memory_snapshot(caller=caller, snapshot_id="before-fix", note="seeded")
    assert c.get_memory(caller=caller, memory_id=first.memory_id).memory.superseded_by
    # A procedure version learned from the session: the user's data too (it quotes their turns).
    c.propose_procedure(
        procedure_id=f"damaged-{sid[-6:]}",
        kind=ppb.PROCEDURE_KIND_ROUTINE,
        content="For a damaged order: apologise, ship a replacement, confirm the delivery door.",
        title="damaged order",
        source_session_id=sid,
    )
    return sid


def test_export_header_and_record_types(client: memlane.Client, user_id: str) -> None:
    _seed(client, user_id)
    lines = [orjson.loads(line) for line in _export(client, user_id).splitlines()]
    head = lines[0]
    assert head["record"] == "header" and head["format"] == "memlane.user-export"
    assert head["format_version"] == 2 and head["memlane_version"] == memlane.__version__
    assert head["user_id"] == user_id
    kinds = {line["record"] for line in lines[1:]}
    assert {"session", "message", "memory", "memory_version", "memory_snapshot"} <= kinds
    assert all(isinstance(line.get("record"), str) for line in lines)
    assert _export(client, _user("nobody")) == b""  # no data: nothing, not a lone header


def test_import_round_trip_into_a_fresh_sidecar(
    server: SidecarThread, start_server: ServerFactory, client: memlane.Client, user_id: str
) -> None:
    sid = _seed(client, user_id)
    data = _export(client, user_id)
    caller = mpb.Caller(user_id=user_id)
    questions = ["how should we contact them?", "where does the user live?", "what is the pet called?"]
    before = {
        q: [
            (h.memory.memory_id, h.memory.content)
            for h in client.search_memories(caller=caller, query=q).results
        ]
        for q in questions
    }
    context_before = _context(client, sid, "when does my replacement arrive?")
    fresh = start_server()  # its own LanceDB and key prefix: another sidecar
    assert fresh.target != server.target
    with memlane.Client(fresh.target, timeout=60) as other:
        receipt = other.import_user_data(data=data)
        assert receipt.user_id == user_id
        assert receipt.imported["session"] == 1 and receipt.imported["message"] == 3
        assert receipt.imported["memory"] == 4 and receipt.imported["memory_snapshot"] == 1
        assert receipt.imported["memory_version"] >= 4
        # The procedure version comes back as a proposal of its owner, under this sidecar's approval.
        assert receipt.imported["procedure"] == 1 and "procedure" not in receipt.not_restored
        [proc] = [p for p in other.list_procedures().procedures if p.procedure_id == f"damaged-{sid[-6:]}"]
        [version] = proc.versions
        assert version.state == ppb.PROCEDURE_STATE_PROPOSED and "replacement" in version.content
        assert version.source_session_id == sid
        after = {
            q: [
                (h.memory.memory_id, h.memory.content)
                for h in other.search_memories(caller=caller, query=q).results
            ]
            for q in questions
        }
        assert after == before
        assert _context(other, sid, "when does my replacement arrive?") == context_before
        rex = next(m for m in client.list_memories(caller=caller).memories if "Rex" in m.content)
        moved = other.get_memory(caller=caller, memory_id=rex.memory_id).memory
        kept = ("memory_id", "content", "kind", "created_at_unix_ms", "source_session_id", "agent_id")
        assert all(getattr(moved, f) == getattr(rex, f) for f in kept)
        assert list(moved.source_message_ids) == ["m-rex"]  # provenance kept
        assert [s.snapshot_id for s in other.list_memory_snapshots(caller=caller).snapshots] == ["before-fix"]
        # Idempotent: the same file again writes nothing, with or without merge.
        for merge in (False, True):
            again = other.import_user_data(data=data, merge=merge)
            assert (
                dict(again.imported) == {} and again.skipped["memory"] == 4 and again.skipped["session"] == 1
            )
            assert again.skipped["procedure"] == 1
        versions = other.list_memory_versions(caller=caller, page_size=500).versions
        assert len(versions) == receipt.imported["memory_version"]
        # A different file for a user held here is refused unless merge is set.
        extra = (
            data
            + orjson.dumps(
                {
                    "record": "memory",
                    **orjson.loads(next(line for line in data.splitlines() if b'"record":"memory"' in line)),
                    "memory_id": "imported-extra",
                    "content": "Plays the cello.",
                }
            )
            + b"\n"
        )
        with pytest.raises(memlane.AlreadyExistsError, match="merge"):
            other.import_user_data(data=extra)
        assert other.import_user_data(data=extra, merge=True).imported["memory"] == 1
        # Erasure still erases everything imported.
        other.forget_user(user_id=user_id)
        assert _export(other, user_id) == b""


def test_import_refuses_bad_files(client: memlane.Client, user_id: str) -> None:
    head = {"record": "header", "format": "memlane.user-export", "format_version": 1, "user_id": user_id}
    newer = orjson.dumps({**head, "format_version": 3, "memlane_version": "9.0"}) + b"\n"
    with pytest.raises(memlane.FailedPreconditionError, match="format version 3"):
        client.import_user_data(data=newer)
    with pytest.raises(memlane.InvalidArgumentError, match="header"):
        client.import_user_data(data=b'{"record": "session", "session_id": "s"}\n')
    with pytest.raises(memlane.InvalidArgumentError, match="line 2 is not JSON"):
        client.import_user_data(data=orjson.dumps(head) + b"\n{nope\n")
    foreign = {"record": "memory", "id": "x1", "user_id": "someone-else", "content": "hi", "kind": "fact"}
    with pytest.raises(memlane.InvalidArgumentError, match="another user"):
        client.import_user_data(data=orjson.dumps(head) + b"\n" + orjson.dumps(foreign))
    hostile = {**foreign, "user_id": user_id, "id": "x{1}", "scope": "user"}
    with pytest.raises(memlane.InvalidArgumentError, match="line 2"):
        client.import_user_data(data=orjson.dumps(head) + b"\n" + orjson.dumps(hostile))
    typed = {**foreign, "user_id": user_id, "keywords": [1, 2], "scope": "user"}
    with pytest.raises(memlane.InvalidArgumentError, match="line 2"):
        client.import_user_data(data=orjson.dumps(head) + b"\n" + orjson.dumps(typed))
    message = {"record": "message", "session_id": "not-theirs", "message_id": "m1", "role": "user", "seq": 1}
    with pytest.raises(memlane.InvalidArgumentError, match="not a session of the file's user"):
        client.import_user_data(data=orjson.dumps(head) + b"\n" + orjson.dumps({**message, "content": "x"}))
    # Nothing was written by any refused file.
    assert client.list_users(query=user_id).users == []


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=40)
    | hostile_ids(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def test_import_fuzzed_records_never_fail_inside(server: SidecarThread, client: memlane.Client) -> None:
    """Every field of every record type replaced by hostile JSON (ids from tests/hostile.py, wrong types,
    huge numbers, nesting): the import answers INVALID_ARGUMENT naming a line, or imports, never
    INTERNAL; the sidecar still serves the user afterwards."""
    user = _user("fuzz-import")
    sid = _seed(client, user)
    lines = [orjson.loads(line) for line in _export(client, user).splitlines()]
    head, records = lines[0], [r for r in lines[1:] if r["record"] != "trace"]
    client.forget_user(user_id=user)

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(index=st.integers(0, len(records) - 1), field=st.integers(0, 40), value=_JSON_VALUES)
    def run(index: int, field: int, value: object) -> None:
        record = dict(records[index])
        names = [k for k in record if k != "record"]
        record[names[field % len(names)]] = value
        # The session goes with each record, so a message is checked field by field, not refused whole
        # for naming a session the file does not hold.
        context = [orjson.dumps(r) for r in records if r["record"] == "session" and r is not records[index]]
        data = b"\n".join(
            [orjson.dumps(head), *context, orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS)]
        )
        try:
            client.import_user_data(data=data, merge=True)
        except (memlane.InvalidArgumentError, memlane.AlreadyExistsError) as exc:
            assert "INTERNAL" not in str(exc)
        except memlane.MemlaneError as exc:
            raise AssertionError(
                f"{record['record']}.{names[field % len(names)]}={value!r}: {exc!r}"
            ) from exc

    run()
    client.forget_user(user_id=user)
    assert client.create_session(user_id=user, session_id=sid).session.user_id == user  # still serving
    client.forget_user(user_id=user)


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        ("message", "metadata", {"a": 1}),
        ("message", "content", 5),
        ("message", "seq", -1),
        ("message", "role", "emperor"),
        ("session", "metadata", "[1]"),
        ("session", "status", 99),
        ("memory", "importance", "high"),
        ("memory", "kind", "gossip"),
        ("memory", "metadata", [1]),
        ("memory", "content", "Card 4111 1111 1111 1111 on file."),  # personal data, as CreateMemory refuses
        ("memory_version", "item", {"id": "x"}),
        ("memory_version", "reason", "whim"),
        ("memory_snapshot", "items", [1]),
        ("memory_snapshot", "snapshot_id", "a{b}"),
        ("procedure", "owner", "a:x{y}"),
        ("procedure", "kind", "spell"),
        ("procedure", "content", "Call the user on 4111 1111 1111 1111."),
    ],
)
def test_import_refuses_each_bad_field(client: memlane.Client, kind: str, field: str, value: object) -> None:
    user = _user("badfield")
    _seed(client, user)
    lines = [orjson.loads(line) for line in _export(client, user).splitlines()]
    client.forget_user(user_id=user)
    first = next(i for i, line in enumerate(lines) if line["record"] == kind)
    out = [{**line, field: value} if i == first else line for i, line in enumerate(lines)]
    with pytest.raises(memlane.InvalidArgumentError, match=r"line \d+"):
        client.import_user_data(data=b"\n".join(orjson.dumps(x) for x in out))
    assert client.list_users(query=user).users == []  # refused whole: nothing written


def test_import_refuses_ids_another_user_holds(client: memlane.Client) -> None:
    """Ids are kept, so a file whose sessions or memories carry ids another user holds here is refused
    before anything is written (the other user's data untouched)."""
    owner, other = _user("owner"), _user("other")
    _seed(client, owner)
    data = _export(client, owner).replace(owner.encode(), other.encode())
    with pytest.raises(memlane.AlreadyExistsError, match="taken by another user"):
        client.import_user_data(data=data)
    assert client.list_users(query=other).users == []
    assert client.list_users(query=owner).users[0].memory_count == 4
