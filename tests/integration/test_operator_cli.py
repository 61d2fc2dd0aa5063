"""The operator commands, run as the real CLI against a real sidecar."""

from __future__ import annotations

import json
from pathlib import Path

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

    assert main(["memories", "delete", "--user", user_id, made.memory_id, *target]) == 0
    capsys.readouterr()
    assert main(["memories", "list", "--user", user_id, *target]) == 0
    assert made.memory_id not in capsys.readouterr().out

    assert main(["forget-user", user_id, *target]) == 0
    assert "lancedb.items" in capsys.readouterr().out
    assert main(["memories", "delete", "--user", user_id, "no-such-id", *target]) == 1
    assert "NotFoundError" in capsys.readouterr().err
