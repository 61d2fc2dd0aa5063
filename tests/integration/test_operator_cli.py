"""The operator commands, run as the real CLI against a real sidecar."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import memlane
from memlane.v1 import memory_pb2
from memlane_server.background import SidecarThread
from memlane_server.cli import main


def test_memories_export_and_forget(
    server: SidecarThread,
    client: memlane.Client,
    user_id: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    made = client.create_memory(
        caller=memory_pb2.Caller(user_id=user_id),
        content="The user keeps bees.",
        kind=memory_pb2.MEMORY_KIND_FACT,
    ).memory
    target = ["--target", server.target]  # the older name of --address, still accepted
    assert main(["memories", "list", "--user", user_id, "--json", *target]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]  # JSON lines
    assert [(m["memory_id"], m["content"]) for m in listed] == [(made.memory_id, "The user keeps bees.")]

    out = tmp_path / "export.jsonl"
    assert main(["export-user", user_id, "--out", str(out), *target]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert any(r.get("content") == "The user keeps bees." for r in records)

    # Destructive commands ask first; without a terminal there is no one to ask, so --yes is required.
    assert main(["memories", "delete", "--user", user_id, made.memory_id, *target]) == 2
    assert "pass --yes" in capsys.readouterr().err
    assert client.get_memory(
        caller=memory_pb2.Caller(user_id=user_id), memory_id=made.memory_id
    ).memory.content
    assert main(["memories", "delete", "--user", user_id, made.memory_id, "--yes", *target]) == 0
    capsys.readouterr()
    assert main(["memories", "list", "--user", user_id, *target]) == 0
    assert made.memory_id not in capsys.readouterr().out

    assert main(["forget-user", user_id, *target]) == 2
    assert "pass --yes" in capsys.readouterr().err
    assert main(["export-user", user_id, "--out", str(out), *target]) == 0
    assert out.read_text()  # not erased: nothing was confirmed
    assert main(["forget-user", user_id, "--yes", *target]) == 0
    receipt = json.loads(capsys.readouterr().out)  # JSON, like the other commands
    assert receipt["user_id"] == user_id and receipt["erased"]["redis.sessions"] >= 0
    assert isinstance(receipt["erased"]["lancedb.items"], int)
    assert main(["memories", "delete", "--user", user_id, "no-such-id", "--yes", *target]) == 1
    assert "NotFoundError" in capsys.readouterr().err


def _cli(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """The ``memlane`` command in its own process, as an operator runs it."""
    code = "import sys; from memlane_server.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, **kwargs)


def test_forget_user_asks_at_a_terminal(server: SidecarThread, client: memlane.Client, user_id: str) -> None:
    client.create_memory(
        caller=memory_pb2.Caller(user_id=user_id), content="Keeps bees.", kind=memory_pb2.MEMORY_KIND_FACT
    )

    def answer(reply: bytes) -> tuple[int, bytes]:
        leader, follower = pty.openpty()
        proc = _cli(
            ["forget-user", user_id, "--target", server.target],
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.close(follower)
        os.write(leader, reply)
        out, err = proc.communicate(timeout=120)
        os.close(leader)
        assert b"[y/N]" in err  # the question goes to stderr; stdout is the command's JSON only
        return proc.returncode, out + err

    code, out = answer(b"n\n")
    assert code == 2 and b"nothing done" in out
    assert client.list_memories(caller=memory_pb2.Caller(user_id=user_id)).memories  # still there
    code, out = answer(b"y\n")
    assert code == 0, out
    receipt = json.loads(out.splitlines()[0])
    assert receipt["erased"]["lancedb.items"] == 1, out
    assert not client.list_memories(caller=memory_pb2.Caller(user_id=user_id)).memories


def test_a_reader_that_stops_early_ends_the_command_quietly(
    server: SidecarThread, client: memlane.Client, user_id: str
) -> None:
    """``memlane trace show S | head``: the pipe closes under the command; no BrokenPipeError traceback."""
    sid = client.create_session(user_id=user_id).session.session_id
    client.append_messages(
        session_id=sid, messages=[memlane.Message(role=memlane.Role.ROLE_USER, content="word " * 40_000)]
    )
    # A window that holds the turn, so the trace (what the model saw) carries all 200 KB of it.
    for _ in client.assemble_context(session_id=sid, user_input="and?", model="gpt-4o"):
        pass
    proc = _cli(
        ["trace", "show", sid, "--target", server.target], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10).startswith(b"{")  # the trace is far larger than the pipe's buffer
    proc.stdout.close()  # what head does after its lines
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141, err
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err
    # Positive control: read to the end, the same command succeeds with the whole trace.
    whole = _cli(["trace", "show", sid, "--target", server.target], stdout=subprocess.PIPE)
    out, _ = whole.communicate(timeout=60)
    assert whole.returncode == 0 and json.loads(out)["session_id"] == sid


def test_users_memories_edit_merge_and_import(
    server: SidecarThread,
    client: memlane.Client,
    start_server: Any,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Issue 32's CLI: users list, memories list with --kind/--query/--limit, edit, merge, and an export
    imported into another sidecar; every client subcommand takes --address."""
    user = f"cli-{os.urandom(4).hex()}"
    address = ["--address", server.target]
    caller = memory_pb2.Caller(user_id=user)
    client.create_session(user_id=user)
    ids = [
        client.create_memory(caller=caller, content=text, kind=kind).memory.memory_id
        for text, kind in (
            ("Drinks coffee black.", memory_pb2.MEMORY_KIND_PREFERENCE),
            ("Takes no sugar in coffee.", memory_pb2.MEMORY_KIND_PREFERENCE),
            ("Works as a glassblower.", memory_pb2.MEMORY_KIND_FACT),
        )
    ]
    assert main(["users", "list", "--query", user.upper(), *address]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split("\t") == ["USER_ID", "SESSIONS", "MEMORIES", "LAST_SESSION"]
    assert table[1].split("\t")[:3] == [user, "1", "3"]

    assert main(["memories", "list", "--user", user, "--kind", "fact", "--json", *address]) == 0
    assert [json.loads(x)["memory_id"] for x in capsys.readouterr().out.splitlines()] == [ids[2]]
    assert main(["memories", "list", "--user", user, "--limit", "2", "--json", *address]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["memories", "list", "--user", user, "--query", "coffee", "--limit", "1", *address]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split("\t") == ["MEMORY_ID", "KIND", "SLOT", "SCORE", "CONTENT"] and len(rows) == 2

    edit = ["memories", "edit", "--user", user, ids[2], *address]
    assert main([*edit, "--content", "Works as a glassblower in Murano.", "--slot", "occupation"]) == 0
    edited = json.loads(capsys.readouterr().out)
    assert (
        edited["content"] == "Works as a glassblower in Murano." and edited["slot"] == "job"
    )  # the family's name
    assert main(edit) == 2 and "--content, --kind" in capsys.readouterr().err  # nothing named to change
    assert main([*edit, "--valid-until", "soon"]) == 2 and "--valid-until" in capsys.readouterr().err
    versions = client.list_memory_versions(caller=caller, memory_id=ids[2]).versions
    assert versions[-1].reason == memory_pb2.MEMORY_CHANGE_REASON_EDIT

    merge = ["memories", "merge", "--user", user, ids[0], ids[1], *address]
    assert main([*merge, "--content", "Drinks coffee black, no sugar."]) == 2  # destructive: asks first
    assert "pass --yes" in capsys.readouterr().err
    assert main([*merge, "--content", "Drinks coffee black, no sugar.", "--yes"]) == 0
    merged = json.loads(capsys.readouterr().out)
    assert merged["memory_id"] == ids[0] and merged["superseded_ids"] == [ids[1]]

    out = tmp_path / "export.jsonl"
    assert main(["export-user", user, "--out", str(out), *address]) == 0
    other = start_server()
    imp = ["import-user", str(out), "--address", other.target]
    assert main(imp) == 0
    receipt = json.loads(capsys.readouterr().out)
    assert receipt["user_id"] == user and receipt["imported"]["memory"] == 3
    assert main(imp) == 0  # the same file again: nothing new, and it says so
    again = capsys.readouterr()
    assert json.loads(again.out)["imported"] == {} and "nothing new" in again.err
    with memlane.Client(other.target) as c:
        moved = c.get_memory(caller=caller, memory_id=ids[0]).memory
        assert moved.content == "Drinks coffee black, no sugar."


def test_empty_results_and_errors_in_the_commands_words(
    server: SidecarThread, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    address = ["--address", server.target]
    nobody = f"nobody-{os.urandom(4).hex()}"
    for argv, said in (
        (["sessions", "list", "--user", nobody], f"no sessions of user {nobody!r}"),
        (["export-user", nobody, "--out", str(tmp_path / "x.jsonl")], "no data held about user"),
        (["memories", "list", "--user", nobody], f"no memories of user {nobody!r}"),
        (["users", "list", "--query", nobody], f"no users match {nobody!r}"),
    ):
        assert main([*argv, *address]) == 0, argv
        out = capsys.readouterr()
        assert out.out == "" and said in out.err, (argv, out)
    assert main(["jobs", "retry-parked", *address]) == 2
    err = capsys.readouterr().err
    assert "PARKED_ID" in err and "--all" in err and "parked_ids" not in err
    assert main(["jobs", "retry-parked", "p1", "--all", *address]) == 2
    assert "not both" in capsys.readouterr().err
    # A refusal of the server names the flag that set the field at fault.
    assert main(["memories", "list", "--user", "bad{user}", *address]) == 1
    assert capsys.readouterr().err.startswith("memlane: --user: ")
    assert main(["health", *address]) == 0  # health takes --address like every other subcommand


# Control characters a memory's text may carry to an operator's terminal: OSC (set the window title,
# ended by BEL), CSI (clear the screen), an 8-bit CSI (C1), DEL, and a right-to-left override.
HOSTILE = "Likes tea\x1b]0;pwned\x07\x1b[2J\x9b31m\x7f \u202eevil\u202c done"
RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\x7f", "\u202e", "\u202c")


def test_stored_text_reaches_the_terminal_escaped(server: SidecarThread, client: memlane.Client) -> None:
    """``memories list`` (table, --json and --query) prints a memory's control characters as visible
    escapes: on the base commit the ESC sequences, BEL, C1 and bidi controls
    went to the terminal raw. JSON stays JSON and reads back as the stored text (positive control), and
    ordinary text, accents included, prints as it is."""
    user = f"ops-{os.urandom(4).hex()}"
    who = memory_pb2.Caller(user_id=user)
    client.create_memory(caller=who, content=HOSTILE, kind=memory_pb2.MEMORY_KIND_FACT)
    client.create_memory(caller=who, content="José keeps bees.", kind=memory_pb2.MEMORY_KIND_FACT)
    address = ["--address", server.target]

    def run(*argv: str) -> tuple[str, str]:
        proc = _cli([*argv, *address], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        return out.decode(), err.decode()

    table, _ = run("memories", "list", "--user", user)
    assert not any(c in table for c in RAW_CONTROLS), repr(table)
    assert "Likes tea\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\x7f \\u202eevil\\u202c done" in table
    assert "José keeps bees." in table
    lines, _ = run("memories", "list", "--user", user, "--json")
    assert not any(c in lines for c in RAW_CONTROLS), repr(lines)
    assert {json.loads(line)["content"] for line in lines.splitlines()} == {HOSTILE, "José keeps bees."}
    found, _ = run("memories", "list", "--user", user, "--query", "tea")
    assert not any(c in found for c in RAW_CONTROLS) and "Likes tea" in found


def test_serve_listens_on_address() -> None:
    """``serve --address`` is the one name for the sidecar's address (``--listen``, the setting, too)."""
    from memlane_server.cli import _parser  # noqa: PLC0415 - the parser alone, no server started

    assert _parser().parse_args(["serve", "--address", "127.0.0.1:7001"]).listen == "127.0.0.1:7001"
    assert _parser().parse_args(["serve", "--listen", "127.0.0.1:7002"]).listen == "127.0.0.1:7002"
