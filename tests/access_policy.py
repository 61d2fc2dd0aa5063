"""One access policy for the multi-agent tests: agents, bearer tokens, roles, groups, delegations, and
the access rule it implies, written out independently of the server's code so tests can check it."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import yaml

import memlane
from memlane import VisibilityKind
from memlane_server.background import SidecarThread

AGENTS = ("planner", "researcher", "writer", "outsider", "auditor", "admin")
TOKENS = {a: f"tok-{a}-{uuid.uuid4().hex[:6]}" for a in AGENTS}
# planner orchestrates researcher; planner and researcher form group "research".
GROUPS = {"research": {"planner", "researcher"}}
DELEGATES = {"planner": {"researcher"}}


def policy(**extra: Any) -> dict[str, Any]:
    return {
        "tokens": [{"sha256": hashlib.sha256(TOKENS[a].encode()).hexdigest(), "agent": a} for a in AGENTS],
        "agents": {
            "planner": {"roles": ["orchestrator"], "delegates": sorted(DELEGATES["planner"])},
            "auditor": {"roles": ["auditor"]},
            "admin": {"roles": ["admin"]},
        },
        "groups": {g: sorted(m) for g, m in GROUPS.items()},
        **extra,
    }


def write_policy(path: Path, **extra: Any) -> Path:
    path.write_text(yaml.safe_dump(policy(**extra)))
    return path


def tokens_policy(path: Path, tokens: dict[str, str]) -> Path:
    """A smaller policy of its own for a module: each agent's bearer token (stored as its SHA-256), and
    the agent named "auditor", if any, an auditor."""
    path.write_text(
        yaml.safe_dump(
            {
                "tokens": [
                    {"sha256": hashlib.sha256(t.encode()).hexdigest(), "agent": a} for a, t in tokens.items()
                ],
                "agents": {"auditor": {"roles": ["auditor"]}},
            }
        )
    )
    return path


def as_agent(server: SidecarThread, agent: str, **kw: Any) -> memlane.Client:
    return memlane.Client(server.target, token=TOKENS[agent], timeout=20, **kw)


def can_read_message(reader: str, vis: int, source: str, group: str) -> bool:
    """May ``reader`` read a message (ListMessages)? Auditors read all; orchestrators their delegates'."""
    if reader == "auditor" or vis == VisibilityKind.VISIBILITY_KIND_SESSION:
        return True
    delegated = source in DELEGATES.get(reader, set())
    if vis == VisibilityKind.VISIBILITY_KIND_AGENT:
        return reader == source or delegated
    return reader in GROUPS.get(group, set()) or delegated
