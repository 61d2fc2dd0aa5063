"""Operator commands over memory state: ``memlane snapshots take|list|diff|restore|delete`` (named
snapshots of a user's long-term memory) and ``memlane procedures list|propose|approve|reject|rollback``
(an agent's procedural memory). Thin wrappers over the public client, so the same auth and access rules
apply as to any agent; listings print one JSON object per line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage

import memlane
from memlane.v1 import memory_pb2, procedure_pb2

from .cli_connection import add_connection, client, failed

COMMANDS = ("snapshots", "procedures")
_KINDS = {
    "routine": procedure_pb2.PROCEDURE_KIND_ROUTINE,
    "example": procedure_pb2.PROCEDURE_KIND_EXAMPLE,
    "instruction": procedure_pb2.PROCEDURE_KIND_INSTRUCTION,
}
_STATES = {
    n.removeprefix("PROCEDURE_STATE_").lower(): v
    for n, v in procedure_pb2.ProcedureState.items()
    if v != procedure_pb2.PROCEDURE_STATE_UNSPECIFIED
}


def _print(message: ProtoMessage) -> None:
    print(json.dumps(MessageToDict(message, preserving_proto_field_name=True), ensure_ascii=False))


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    snaps = sub.add_parser("snapshots", help="named snapshots of a user's long-term memory")
    ssub = snaps.add_subparsers(dest="snapshots_command", required=True)
    actions = {
        "take": "snapshot what the caller can read of the user's memory",
        "list": "the user's snapshots, newest first (JSON lines)",
        "diff": "what changed since a snapshot (JSON lines: added, removed, changed)",
        "restore": "put the memory back as the snapshot holds it",
        "delete": "delete a snapshot",
    }
    for name, text in actions.items():
        p = ssub.add_parser(name, help=text)
        add_connection(p)
        p.add_argument("--user", required=True)
        p.add_argument("--agent", default="", help="the view: an agent id (default: the token's own)")
        if name != "list":
            p.add_argument("snapshot_id")
        if name == "take":
            p.add_argument("--note", default="")
        if name == "restore":
            p.add_argument("--backup", default="", help="first snapshot the current state under this name")

    procs = sub.add_parser("procedures", help="an agent's procedural memory: review and approve")
    psub = procs.add_subparsers(dest="procedures_command", required=True)
    ls = psub.add_parser("list", help="procedures with every version (JSON lines)")
    propose = psub.add_parser("propose", help="propose a version (as an operator)")
    decide = {n: psub.add_parser(n, help=f"{n} a version (admins)") for n in ("approve", "reject")}
    back = psub.add_parser("rollback", help="return to an earlier approved version (admins)")
    for p in (ls, propose, *decide.values(), back):
        add_connection(p)
        p.add_argument("--agent", default="", help="the owning agent")
        p.add_argument("--group", default="", help="the owning group (instead of an agent)")
    ls.add_argument("--state", choices=sorted(_STATES), help="only procedures with a version in this state")
    for p in (propose, *decide.values(), back):
        p.add_argument("procedure_id")
    propose.add_argument("--kind", choices=sorted(_KINDS), default="routine")
    propose.add_argument("--title", default="")
    propose.add_argument("--reason", default="")
    propose.add_argument("--content", required=True, help="the text; '-' reads stdin")
    for p in decide.values():
        p.add_argument("version", type=int)
    for p in (*decide.values(), back):
        p.add_argument("--note", default="")
    back.add_argument("--to", type=int, default=0, help="the version (default: the one active before)")


def run(args: argparse.Namespace) -> int:
    with client(args, timeout=600) as c:
        try:
            if args.command == "snapshots":
                return _snapshots(c, args)
            return _procedures(c, args)
        except memlane.MemlaneError as exc:
            return failed(exc)


def _snapshots(c: memlane.Client, args: argparse.Namespace) -> int:
    caller = memory_pb2.Caller(user_id=args.user, agent_id=args.agent)
    cmd = args.snapshots_command
    if cmd == "take":
        _print(c.create_memory_snapshot(caller=caller, snapshot_id=args.snapshot_id, note=args.note).snapshot)
    elif cmd == "list":
        pages = memlane.iter_pages(
            lambda t: c.list_memory_snapshots(caller=caller, page_size=100, page_token=t), "snapshots"
        )
        for snap in pages:
            _print(snap)
    elif cmd == "diff":
        for d in c.get_memory_snapshot_diff(caller=caller, snapshot_id=args.snapshot_id).diffs:
            _print(d)
    elif cmd == "restore":
        out = c.restore_memory_snapshot(
            caller=caller, snapshot_id=args.snapshot_id, backup_snapshot_id=args.backup
        )
        counts: dict[str, int] = {}
        for d in out.diffs:
            name = memory_pb2.MemoryDiffKind.Name(d.kind).removeprefix("MEMORY_DIFF_KIND_").lower()
            counts[name] = counts.get(name, 0) + 1
        print(json.dumps({"undone": counts, "backup": out.backup.snapshot_id}))
    else:
        c.delete_memory_snapshot(caller=caller, snapshot_id=args.snapshot_id)
    return 0


def _procedures(c: memlane.Client, args: argparse.Namespace) -> int:
    owner = procedure_pb2.ProcedureOwner(agent_id=args.agent, group=args.group)
    cmd = args.procedures_command
    out: Any
    if cmd == "list":
        state = _STATES[args.state] if args.state else procedure_pb2.PROCEDURE_STATE_UNSPECIFIED
        pages = memlane.iter_pages(
            lambda t: c.list_procedures(owner=owner, state=state, page_size=200, page_token=t), "procedures"
        )
        for proc in pages:
            _print(proc)
        return 0
    if cmd == "propose":
        content = sys.stdin.read() if args.content == "-" else args.content
        out = c.propose_procedure(
            owner=owner,
            procedure_id=args.procedure_id,
            kind=_KINDS[args.kind],
            title=args.title,
            reason=args.reason,
            content=content,
        )
    elif cmd == "approve":
        out = c.approve_procedure(
            owner=owner, procedure_id=args.procedure_id, version=args.version, note=args.note
        )
    elif cmd == "reject":
        out = c.reject_procedure(
            owner=owner, procedure_id=args.procedure_id, version=args.version, note=args.note
        )
    else:
        out = c.roll_back_procedure(
            owner=owner, procedure_id=args.procedure_id, to_version=args.to, note=args.note
        )
    _print(out.procedure)
    return 0
