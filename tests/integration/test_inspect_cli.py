"""``memlane health``, ``memlane sessions list|show`` and ``memlane trace show`` as the real CLI against a
real sidecar, with JSON output a script can parse."""

from __future__ import annotations

import json

import pytest

import memlane
from memlane import Message, Role
from memlane_server.background import SidecarThread
from memlane_server.cli import main


def test_health(server: SidecarThread, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "--target", server.target]) == 0
    assert capsys.readouterr().out.strip() == "SERVING"
    assert main(["health", "--target", "127.0.0.1:1", "--timeout", "1"]) == 1
    assert "health check failed: UNAVAILABLE" in capsys.readouterr().err


def test_sessions_and_traces_as_json(
    server: SidecarThread, client: memlane.Client, user_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = ["--target", server.target]
    first = client.create_session(user_id=user_id, agent_id="a1").session.session_id
    second = client.create_session(user_id=user_id, agent_id="a1").session.session_id
    client.append_messages(
        session_id=second,
        messages=[
            Message(role=Role.ROLE_USER, content="Ship it to 12 Elm Street."),
            Message(role=Role.ROLE_ASSISTANT, content="Will do."),
        ],
    )
    client.close_session(session_id=first)

    assert main(["sessions", "list", "--user", user_id, *target]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["session_id"] for r in rows] == [second, first]  # newest first
    assert main(["sessions", "list", "--user", user_id, "--status", "closed", *target]) == 0
    assert [json.loads(line)["session_id"] for line in capsys.readouterr().out.splitlines()] == [first]

    assert main(["sessions", "show", second, *target]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["session_id"] == second
    assert [m["content"] for m in shown["messages"]] == ["Ship it to 12 Elm Street.", "Will do."]

    # No trace before the first assembly; then the latest one, blocks and stats included.
    assert main(["trace", "show", second, *target]) == 1
    assert "no turn traces" in capsys.readouterr().err
    for _ in client.assemble_context(session_id=second, user_input="where to?"):
        pass
    assert main(["trace", "show", second, *target]) == 0
    trace = json.loads(capsys.readouterr().out)
    assert trace["session_id"] == second and trace["stats"]["trace_id"] == trace["trace_id"]
    assert any("Elm Street" in m["content"] for b in trace["blocks"] for m in b.get("messages", []))
    assert main(["trace", "show", second, trace["trace_id"], *target]) == 0
    assert json.loads(capsys.readouterr().out)["trace_id"] == trace["trace_id"]

    assert main(["sessions", "show", "no-such-session", *target]) == 1
    assert "NotFoundError" in capsys.readouterr().err
