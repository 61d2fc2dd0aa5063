"""Strands ``SessionMessage`` records <-> memlane session messages.

A record (the message, its index, its redaction, its times) is stored whole as the message's native
object (``format="strands"``, the record's own ``to_dict()``, bytes base64-encoded as Strands does), so
it reads back equal. The role, the text the model would see (the redaction when there is one) and the
tool use ids are derived for memlane's summaries, recall and promotion. The Strands agent and index
travel in the message's metadata and name the message: ``strands-<agent digest>-<index>``, so a record
written twice (a retried call) lands once.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from memlane.v1 import session_pb2 as pb

NATIVE_FORMAT = "strands"
AGENT_KEY = "strands.agent_id"
INDEX_KEY = "strands.index"


def message_id(agent_id: str, index: int) -> str:
    """The memlane id of one agent's record: agent ids are free text, so a digest names the agent."""
    digest = hashlib.blake2b(agent_id.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"strands-{digest}-{index}"


def _text(message: dict[str, Any]) -> tuple[str, list[str]]:
    """The readable text of a Strands message and the tool use ids it carries."""
    parts: list[str] = []
    calls: list[str] = []
    for block in message.get("content") or []:
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif isinstance(use := block.get("toolUse"), dict):
            calls.append(str(use.get("toolUseId", "")))
            parts.append(f"{use.get('name', '')}({json.dumps(use.get('input'), ensure_ascii=False)})")
        elif isinstance(result := block.get("toolResult"), dict):
            calls.append(str(result.get("toolUseId", "")))
            inner = result.get("content") or []
            parts.extend(
                str(c["text"]) for c in inner if isinstance(c, dict) and isinstance(c.get("text"), str)
            )
    return "\n".join(p for p in parts if p), [c for c in calls if c]


def to_message(record: dict[str, Any], agent_id: str, author: str) -> pb.Message:
    """``record``: a SessionMessage's ``to_dict()``."""
    shown = record.get("redact_message") or record["message"]
    text, calls = _text(shown)
    role = pb.ROLE_ASSISTANT if shown.get("role") == "assistant" else pb.ROLE_USER
    if role == pb.ROLE_USER and calls and not any("text" in b for b in shown.get("content") or []):
        role = pb.ROLE_TOOL  # Strands sends tool results as a user message
    return pb.Message(
        message_id=message_id(agent_id, int(record["message_id"])),
        role=role,
        content=text,
        source_agent_id=author if role == pb.ROLE_ASSISTANT else "",
        tool_call_ids=calls,
        native=pb.NativeMessage(format=NATIVE_FORMAT, json=json.dumps(record, ensure_ascii=False)),
        metadata={AGENT_KEY: agent_id, INDEX_KEY: str(record["message_id"])},
    )


def record_of(m: pb.Message, agent_id: str) -> dict[str, Any] | None:
    """The record ``m`` holds if it is one of ``agent_id``'s, else None."""
    if m.native.format != NATIVE_FORMAT or m.metadata.get(AGENT_KEY) != agent_id or not m.native.json:
        return None
    record = json.loads(m.native.json)
    return record if isinstance(record, dict) and "message" in record else None
