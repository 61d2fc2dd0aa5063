"""Read-only inspection commands against a running sidecar: ``memlane health``, ``memlane sessions
list|show`` and ``memlane trace show``. They go through the public client (same auth and policy as any
agent) and print JSON, one object per line for lists, so scripts can parse them."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage

import memlane
from memlane.v1 import session_pb2

from .cli_connection import add_connection, client, failed, say

COMMANDS = ("health", "sessions", "trace")
_STATUSES = [n.removeprefix("SESSION_STATUS_").lower() for n in session_pb2.SessionStatus.keys()][1:]  # noqa: SIM118


def as_dict(message: ProtoMessage) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def _print(obj: dict[str, Any], *, pretty: bool = False) -> None:
    print(json.dumps(obj, indent=2 if pretty else None, ensure_ascii=False, sort_keys=pretty))


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
    ls.add_argument("--status", choices=_STATUSES, help="only sessions in this status")
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


def run(args: argparse.Namespace) -> int:
    if args.command == "health":
        return _health(args)
    with client(args, timeout=60) as c:
        try:
            if args.command == "sessions":
                return _sessions(c, args)
            return _trace(c, args)
        except memlane.MemlaneError as exc:
            return failed(exc)


def _health(args: argparse.Namespace) -> int:
    import grpc  # noqa: PLC0415 - grpcio-health-checking is a server extra; the image has it
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: PLC0415

    with grpc.insecure_channel(args.address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            print(f"memlane: health check failed: {exc.code().name}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def _sessions(c: memlane.Client, args: argparse.Namespace) -> int:
    if args.sessions_command == "list":
        status = session_pb2.SessionStatus.SESSION_STATUS_UNSPECIFIED
        if args.status:
            status = session_pb2.SessionStatus.Value(f"SESSION_STATUS_{args.status.upper()}")
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
            _print(as_dict(s))
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
    out = as_dict(session)
    out["messages"] = [as_dict(m) for m in reversed(messages)]
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
    _print(as_dict(trace), pretty=True)
    return 0
