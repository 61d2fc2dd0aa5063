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
    target = ["--target", server.target]
    assert main(["memories", "list", "--user", user_id, *target]) == 0
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
