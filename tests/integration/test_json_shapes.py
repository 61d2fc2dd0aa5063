"""Issue 47, item 4: one JSON shape for each thing across the CLI, the MCP tools and the export, and one
memory id shape. Before, the CLI printed ``"status": "SESSION_STATUS_CLOSED"`` and int64 fields as
strings (protobuf's MessageToDict), MCP said ``closed``/``fact`` with integers, the export wrote
``"status": 3``, ``id`` and ``changed_at_ms``; and MCP's remember stored a bare ULID as the memory id
while every other client got the sidecar's ``mem_...``. Each test runs the real commands (``memlane``'s
own entry point), the real MCP server over stdio, or a real export, against a real sidecar."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from memlane_server.cli import main
from memlane_server.ltm.model import is_server_id
from tests.conftest import wait_for
from tests.integration.test_mcp import ok, stdio


def _lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _the(memory_id: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The row of ``memory_id`` (the closed session's end learns memories of its own, an episode)."""
    (row,) = [r for r in rows if r["memory_id"] == memory_id]
    return row


def _closed_session_with_a_memory(c: memlane.Client, user: str) -> tuple[str, mpb.Memory]:
    sid = f"s-{user}"
    c.create_session(session_id=sid, user_id=user, agent_id="desk")
    c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="Hello there.")])
    caller = mpb.Caller(user_id=user, agent_id="desk")
    made = c.create_memory(caller=caller, content="Keeps bees.", kind=mpb.MEMORY_KIND_FACT).memory
    edit = mpb.Memory(memory_id=made.memory_id, content="Keeps two hives of bees.")
    c.update_memory(caller=caller, memory=edit, update_mask=FieldMask(paths=["content"]))
    c.close_session(session_id=sid)
    # Once the session's end has run, nothing changes under the test (its learning merges, edits).
    done = (memlane.PromotionState.PROMOTION_STATE_PROMOTED, memlane.PromotionState.PROMOTION_STATE_ARCHIVED)
    wait_for(lambda: c.get_session(session_id=sid).session.promotion_state in done, timeout=30)
    return sid, made


def test_the_cli_prints_integers_as_numbers_and_enums_by_their_short_name(
    server: SidecarThread, client: memlane.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sessions list``/``show`` and ``memories list --json`` print int64 fields as JSON numbers and
    enums as ``closed``/``fact``/``user``, as the MCP tools do (base: ``"token_total": "5"``,
    ``"status": "SESSION_STATUS_CLOSED"``, ``"created_at_unix_ms": "1796..."``)."""
    user = f"shape-{uuid.uuid4().hex[:8]}"
    sid, made = _closed_session_with_a_memory(client, user)
    address = ["--address", server.target]
    assert main(["sessions", "list", "--user", user, "--status", "closed", *address]) == 0
    (listed,) = _lines(capsys)
    assert listed["session_id"] == sid and listed["status"] == "closed"
    assert listed["topology"] == "shared"
    for key in ("created_at_unix_ms", "closed_at_unix_ms", "token_total", "message_count"):
        assert type(listed[key]) is int and listed[key] > 0, key
    assert main(["sessions", "show", sid, *address]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "closed" and shown["messages"][0]["role"] == "user"
    assert (
        type(shown["messages"][0]["seq"]) is int and type(shown["messages"][0]["created_at_unix_ms"]) is int
    )

    assert main(["memories", "list", "--user", user, "--json", *address]) == 0
    row = _the(made.memory_id, _lines(capsys))
    assert (row["memory_id"], row["kind"], row["scope"]) == (made.memory_id, "fact", "user")
    assert type(row["created_at_unix_ms"]) is int and row["created_at_unix_ms"] == made.created_at_unix_ms
    # Control: the flags take the same spelling the output uses.
    assert main(["memories", "list", "--user", user, "--kind", row["kind"], "--json", *address]) == 0
    assert made.memory_id in [r["memory_id"] for r in _lines(capsys)]
    client.forget_user(user_id=user)


def test_the_export_names_things_as_the_cli_does_and_reads_back(
    server: SidecarThread, client: memlane.Client, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``export-user`` writes format version 2: a memory's ``memory_id`` and ``*_unix_ms`` times, a
    version's ``changed_at_unix_ms`` and ``memory``, the session's ``status`` by name, the same keys and
    values ``memories list --json`` and ``sessions list`` print (base: ``id``, ``created_at_ms``,
    ``changed_at_ms``, ``"status": 3``). The file imports again into a fresh user's place."""
    user = f"shape-{uuid.uuid4().hex[:8]}"
    sid, made = _closed_session_with_a_memory(client, user)
    address = ["--address", server.target]
    out = tmp_path / "export.jsonl"
    assert main(["export-user", user, "--out", str(out), *address]) == 0
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    head = records[0]
    assert head["format_version"] == 2 and type(head["exported_at_unix_ms"]) is int
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in records[1:]:
        by_kind.setdefault(r["record"], []).append(r)
    (session,) = by_kind["session"]
    assert session["status"] == "closed" and session["topology"] == "shared"
    memory = _the(made.memory_id, by_kind["memory"])
    assert main(["memories", "list", "--user", user, "--json", *address]) == 0
    row = _the(made.memory_id, _lines(capsys))
    for key in ("memory_id", "kind", "scope", "content", "created_at_unix_ms", "updated_at_unix_ms"):
        assert memory[key] == row[key], key
    assert "id" not in memory and "created_at_ms" not in memory
    versions = [v for v in by_kind["memory_version"] if v["memory_id"] == made.memory_id]
    assert {v["memory"]["memory_id"] for v in versions} == {made.memory_id} and len(versions) >= 2
    history = client.list_memory_versions(caller=mpb.Caller(user_id=user), memory_id=made.memory_id).versions
    assert sorted(v["changed_at_unix_ms"] for v in versions) == sorted(v.changed_at_unix_ms for v in history)

    client.forget_user(user_id=user)
    assert main(["import-user", str(out), *address]) == 0
    assert json.loads(capsys.readouterr().out)["imported"]["memory"] == len(by_kind["memory"])
    back = client.get_memory(caller=mpb.Caller(user_id=user), memory_id=made.memory_id).memory
    assert back.content == "Keeps two hives of bees." and back.created_at_unix_ms == made.created_at_unix_ms
    assert client.get_session(session_id=sid).session.status == memlane.SessionStatus.SESSION_STATUS_CLOSED
    again = client.list_memory_versions(caller=mpb.Caller(user_id=user), memory_id=made.memory_id).versions
    assert [v.changed_at_unix_ms for v in again] == [v.changed_at_unix_ms for v in history]
    client.forget_user(user_id=user)


def _version_one(records: list[dict[str, Any]]) -> bytes:
    """An export as memlane wrote it before version 2 (the stored names), from a file of either."""
    out = []
    for line in records:
        r = {k.replace("_unix_ms", "_ms"): v for k, v in line.items()}
        if r["record"] == "header":
            r["format_version"] = 1
        elif r["record"] == "session":
            r.update({k: {"closed": 3, "shared": 1}.get(r[k], r[k]) for k in ("status", "topology")})
            r["promotion_state"] = 4
        elif r["record"] == "memory":
            r["id"] = r.pop("memory_id", r.get("id"))
        elif r["record"] == "memory_version":
            item = {k.replace("_unix_ms", "_ms"): v for k, v in r.pop("memory", r.get("item")).items()}
            item["id"] = item.pop("memory_id", item.get("id"))
            r["item"] = item
        out.append(orjson.dumps(r))
    return b"\n".join(out) + b"\n"


def test_an_export_of_an_earlier_version_still_imports(
    server: SidecarThread, client: memlane.Client, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Positive control: a format-version-1 file (``id``, ``*_ms``, ``item``, ``"status": 3``) imports as
    it did, with its times and the session's status kept."""
    user = f"shape-{uuid.uuid4().hex[:8]}"
    sid, made = _closed_session_with_a_memory(client, user)
    data = b"".join(p.data for p in client.export_user_data(user_id=user))
    old = _version_one([orjson.loads(line) for line in data.splitlines()])
    assert b'"format_version":1' in old and b'"changed_at_ms"' in old and b'"status":3' in old
    history = client.list_memory_versions(caller=mpb.Caller(user_id=user), memory_id=made.memory_id).versions
    client.forget_user(user_id=user)
    path = tmp_path / "v1.jsonl"
    path.write_bytes(old)
    assert main(["import-user", str(path), "--address", server.target]) == 0
    assert json.loads(capsys.readouterr().out)["imported"]["memory_version"] >= len(history) >= 2
    back = client.get_memory(caller=mpb.Caller(user_id=user), memory_id=made.memory_id).memory
    assert back.created_at_unix_ms == made.created_at_unix_ms
    assert client.get_session(session_id=sid).session.status == memlane.SessionStatus.SESSION_STATUS_CLOSED
    again = client.list_memory_versions(caller=mpb.Caller(user_id=user), memory_id=made.memory_id).versions
    assert [v.changed_at_unix_ms for v in again] == [v.changed_at_unix_ms for v in history]
    client.forget_user(user_id=user)


async def test_mcp_remember_gets_the_sidecars_id_and_a_retry_lands_once(server: SidecarThread) -> None:
    """MCP's remember stores the memory under the sidecar's own id (``mem_...``), as the Python and
    TypeScript clients do (base: a bare ULID the MCP server made up). The call stays safe to repeat: the
    same statement again merges into the first memory, the same id, not a second one. Its memory reads
    back through ``list_memories`` in the CLI's shape."""
    user = f"shape-{uuid.uuid4().hex[:8]}"
    async with stdio(server.target, "--user", user) as s:
        first = await ok(s, "remember", content="Speaks Basque at home.", kind="fact", slot="home_language")
        assert first["outcome"] == "created" and is_server_id(first["memory_id"])
        again = await ok(s, "remember", content="Speaks Basque at home.", kind="fact", slot="home_language")
        assert (again["outcome"], again["memory_id"]) == ("merged", first["memory_id"])
        listed = (await ok(s, "list_memories"))["memories"]
    assert [m["memory_id"] for m in listed] == [first["memory_id"]]
    with memlane.Client(server.target) as c:
        held = c.get_memory(caller=mpb.Caller(user_id=user), memory_id=first["memory_id"]).memory
        assert held.content == "Speaks Basque at home."
        c.forget_user(user_id=user)
    (shown,) = listed
    assert (shown["kind"], shown["slot"]) == ("fact", "home_language")
    assert type(shown["created_at_unix_ms"]) is int and shown["created_at_unix_ms"] == held.created_at_unix_ms
