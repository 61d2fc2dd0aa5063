"""What a running sidecar holds, read and managed from the command line, through the public client (the
same auth and access rules as any agent); they print JSON, one object per line for lists, so scripts
can parse them.

- Read-only inspection: ``memlane health``, ``memlane sessions list|show`` and ``memlane trace show``.
- Memory state (operator commands): ``memlane snapshots take|list|diff|restore|delete`` (named snapshots
  of a user's long-term memory) and ``memlane procedures list|propose|approve|reject|rollback`` (an
  agent's procedural memory).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from google.protobuf.message import Message as ProtoMessage

import memlane
from memlane._json import enum_name, enum_names, to_json
from memlane.v1 import memory_pb2, procedure_pb2, session_pb2

from .connection import add_connection, client, failed, say
from .terminal import json_line

COMMANDS = ("health", "sessions", "trace", "snapshots", "procedures")
_STATUSES = enum_names(session_pb2.SessionStatus)


# Messages print in the one JSON shape of memlane's messages (memlane/_json.py), as the MCP tools do.
def _print(obj: dict[str, Any], *, pretty: bool = False) -> None:
    print(json_line(obj, pretty=pretty))


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    health = sub.add_parser("health", help="ask a sidecar for gRPC health; exit 0 when SERVING")
    add_connection(health)
    health.add_argument("--service", default="", help="a service name (default: the server as a whole)")
    health.add_argument("--timeout", type=float, default=5.0, help="seconds (default %(default)s)")

    sessions = sub.add_parser("sessions", help="list a user's sessions or show one session")
    ssub = sessions.add_subparsers(dest="sessions_command", required=True)
    ls = ssub.add_parser("list", help="a user's sessions, newest first, one JSON object per line")
    add_connection(ls)
    ls.add_argument("--user", required=True, help="the user id")
    ls.add_argument("--status", choices=list(_STATUSES), help="only sessions in this status")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default %(default)s)")
    show = ssub.add_parser("show", help="one session and its latest messages, as one JSON object")
    add_connection(show)
    show.add_argument("session_id")
    show.add_argument(
        "--messages", type=int, default=50, help="latest messages to include (default %(default)s)"
    )

    trace = sub.add_parser("trace", help="what the model saw: a turn trace of a session")
    tsub = trace.add_subparsers(dest="trace_command", required=True)
    tshow = tsub.add_parser("show", help="one turn trace as JSON (the latest when no trace id is given)")
    add_connection(tshow)
    tshow.add_argument("session_id")
    tshow.add_argument("trace_id", nargs="?", default="", help="a trace id (default: the latest)")
    _add_state_parsers(sub)


def _health(args: argparse.Namespace) -> int:
    import grpc  # noqa: PLC0415 - grpcio-health-checking is a server extra; the image has it
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: PLC0415

    from ..observability.health import REASONS_KEY  # noqa: PLC0415

    with grpc.insecure_channel(args.address) as channel:
        try:
            reply, call = health_pb2_grpc.HealthStub(channel).Check.with_call(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            print(f"memlane: health check failed: {exc.code().name}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    for key, value in call.trailing_metadata() or ():
        if key == REASONS_KEY:  # which part cannot serve, and why (observability/health.py)
            for why in str(value).split(" | "):
                print(f"  {why}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def _sessions(c: memlane.Client, args: argparse.Namespace) -> int:
    if args.sessions_command == "list":
        status = session_pb2.SessionStatus.SESSION_STATUS_UNSPECIFIED
        if args.status:
            status = _STATUSES[args.status]
        if args.limit < 1:
            say("--limit must be at least 1")
            return 2
        shown = 0
        for s in memlane.iter_pages(
            lambda t: c.list_sessions(
                user_id=args.user, status=status, page_size=min(args.limit, 1000), page_token=t
            ),
            "sessions",
        ):
            if shown >= args.limit:
                break
            _print(to_json(s))
            shown += 1
        if not shown:
            say(f"no sessions of user {args.user!r}" + (f" in status {args.status}" if args.status else ""))
        return 0
    session = c.get_session(session_id=args.session_id).session
    messages = c.list_messages(
        session_id=args.session_id,
        order=memlane.MessageOrder.MESSAGE_ORDER_NEWEST_FIRST,
        page_size=max(1, min(args.messages, 1000)),
    ).messages
    out = to_json(session)
    out["messages"] = [to_json(m) for m in reversed(messages)]
    _print(out, pretty=True)
    return 0


def _trace(c: memlane.Client, args: argparse.Namespace) -> int:
    if args.trace_id:
        trace = c.get_turn_trace(session_id=args.session_id, trace_id=args.trace_id).trace
    else:
        traces = c.list_turn_traces(session_id=args.session_id, page_size=1).traces
        if not traces:
            say(f"session {args.session_id!r} has no turn traces yet")
            return 1
        trace = traces[0]
    _print(to_json(trace), pretty=True)
    return 0


# Memory state: snapshots and procedures (operator commands).

_KINDS = {
    "routine": procedure_pb2.PROCEDURE_KIND_ROUTINE,
    "example": procedure_pb2.PROCEDURE_KIND_EXAMPLE,
    "instruction": procedure_pb2.PROCEDURE_KIND_INSTRUCTION,
}
_STATES = enum_names(procedure_pb2.ProcedureState)


def _print_line(message: ProtoMessage) -> None:
    _print(to_json(message))


def _add_state_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _snapshots(c: memlane.Client, args: argparse.Namespace) -> int:
    caller = memory_pb2.Caller(user_id=args.user, agent_id=args.agent)
    cmd = args.snapshots_command
    if cmd == "take":
        _print_line(
            c.create_memory_snapshot(caller=caller, snapshot_id=args.snapshot_id, note=args.note).snapshot
        )
    elif cmd == "list":
        pages = memlane.iter_pages(
            lambda t: c.list_memory_snapshots(caller=caller, page_size=100, page_token=t), "snapshots"
        )
        for snap in pages:
            _print_line(snap)
    elif cmd == "diff":
        for d in c.get_memory_snapshot_diff(caller=caller, snapshot_id=args.snapshot_id).diffs:
            _print_line(d)
    elif cmd == "restore":
        out = c.restore_memory_snapshot(
            caller=caller, snapshot_id=args.snapshot_id, backup_snapshot_id=args.backup
        )
        counts: dict[str, int] = {}
        for d in out.diffs:
            name = enum_name(memory_pb2.MemoryDiffKind.DESCRIPTOR, d.kind)
            counts[name] = counts.get(name, 0) + 1
        _print({"undone": counts, "backup": out.backup.snapshot_id})
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
            _print_line(proc)
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
    _print_line(out.procedure)
    return 0


# The reads answer at once; a snapshot or a procedure change of a large user may take minutes.
_RUNS = {
    "sessions": (_sessions, 60),
    "trace": (_trace, 60),
    "snapshots": (_snapshots, 600),
    "procedures": (_procedures, 600),
}


def run(args: argparse.Namespace) -> int:
    if args.command == "health":
        return _health(args)
    command, timeout = _RUNS[args.command]
    with client(args, timeout=timeout) as c:
        try:
            return command(c, args)
        except memlane.MemlaneError as exc:
            return failed(exc)
