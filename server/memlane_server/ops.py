"""Operator commands (``memlane memories``, ``jobs``, ``forget-user``, ``export-user``): thin wrappers
over the public client against a running sidecar, so they obey the same auth and policy as any agent."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from google.protobuf.json_format import MessageToDict

import memlane
from memlane.v1 import admin_pb2, memory_pb2


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def connection(p: argparse.ArgumentParser) -> None:
        p.add_argument("--target", default=os.environ.get("MEMLANE_TARGET", memlane.DEFAULT_TARGET))
        p.add_argument("--token", default=os.environ.get("MEMLANE_TOKEN"), help="($MEMLANE_TOKEN)")

    memories = sub.add_parser("memories", help="list or delete a user's long-term memories")
    msub = memories.add_subparsers(dest="memories_command", required=True)
    ls = msub.add_parser("list", help="one JSON object per line")
    rm = msub.add_parser("delete", help="delete one memory")
    for p in (ls, rm):
        connection(p)
        p.add_argument("--user", required=True)
        p.add_argument("--agent", default="")
    rm.add_argument("memory_id")
    forget = sub.add_parser("forget-user", help="erase a user everywhere (Redis, LanceDB, archives)")
    connection(forget)
    forget.add_argument("user")
    for p in (rm, forget):
        p.add_argument(
            "--yes", action="store_true", help="do not ask (required when stdin is not a terminal)"
        )
    jobs = sub.add_parser("jobs", help="session-end jobs parked after repeated failures")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True)
    parked = jsub.add_parser("list-parked", help="one JSON object per line")
    retry = jsub.add_parser("retry-parked", help="queue parked jobs again")
    for p in (parked, retry):
        connection(p)
    retry.add_argument("parked_ids", nargs="*", help="the jobs' parked_id (see list-parked)")
    retry.add_argument("--all", action="store_true", help="every parked job")
    export = sub.add_parser("export-user", help="everything held about a user")
    connection(export)
    export.add_argument("user")
    export.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    export.add_argument("--out", help="a file (jsonl; default stdout) or a directory (parquet)")


def confirmed(args: argparse.Namespace, what: str) -> bool:
    """``--yes``, or a "y" typed at the terminal. Without a terminal (a script, a pipe, CI) there is no
    one to ask: refuse, so a stray command in a script never erases anyone."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        print(f"memlane: {what}: pass --yes to confirm (stdin is not a terminal)", file=sys.stderr)
        return False
    # The question on stderr: stdout carries only the command's JSON.
    print(f"{what}? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("memlane: not confirmed; nothing done", file=sys.stderr)
    return False


def run(args: argparse.Namespace) -> int:
    if args.command == "forget-user":
        what = f"erase user {args.user!r} everywhere (Redis, LanceDB, archives)"
    elif args.command == "memories" and args.memories_command == "delete":
        what = f"delete memory {args.memory_id!r} of user {args.user!r}"
    else:
        what = ""
    if what and not confirmed(args, what):
        return 2
    with memlane.Client(args.target, token=args.token, timeout=600) as c:
        try:
            if args.command == "memories":
                caller = memory_pb2.Caller(user_id=args.user, agent_id=args.agent)
                if args.memories_command == "delete":
                    c.delete_memory(caller=caller, memory_id=args.memory_id)
                    return 0
                for item in memlane.iter_pages(
                    lambda t: c.list_memories(caller=caller, page_size=500, page_token=t), "memories"
                ):
                    print(json.dumps(MessageToDict(item, preserving_proto_field_name=True)))
                return 0
            if args.command == "jobs":
                return _jobs(c, args)
            if args.command == "forget-user":
                receipt = c.forget_user(user_id=args.user)
                # JSON, like every other command's output; counts as numbers (MessageToDict would print
                # int64 as strings).
                out = {
                    "user_id": receipt.user_id,
                    "erased": dict(sorted(receipt.erased.items())),
                    "rewritten": list(receipt.rewritten),
                    "operator_actions": list(receipt.operator_actions),
                    "completed_at_unix_ms": receipt.completed_at_unix_ms,
                }
                print(json.dumps(out))
                for action in receipt.operator_actions:  # the erasure is not complete until these are done
                    print(f"memlane: operator action needed: {action}", file=sys.stderr)
                return 0
            return _export(c, args)
        except memlane.MemlaneError as exc:
            print(f"memlane: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1


def _jobs(c: memlane.Client, args: argparse.Namespace) -> int:
    if args.jobs_command == "list-parked":
        for job in memlane.iter_pages(lambda t: c.list_parked_jobs(page_size=500, page_token=t), "jobs"):
            print(json.dumps(MessageToDict(job, preserving_proto_field_name=True)))
        return 0
    out = c.retry_parked_jobs(parked_ids=args.parked_ids, all=args.all)
    for job in out.retried:
        print(f"retried\t{job.parked_id}\t{job.session_id}")
    for pid in out.not_parked:
        print(f"not parked\t{pid}")
    return 0


def _progress(
    parts: Iterable[admin_pb2.ExportUserDataResponse],
) -> Iterator[admin_pb2.ExportUserDataResponse]:
    """Bytes received, as a bar on stderr when it is a terminal (tqdm comes with the server extras; a
    client-only install exports without a bar)."""
    try:
        from tqdm import tqdm  # noqa: PLC0415 - optional: this module must import on a client-only install
    except ImportError:
        yield from parts
        return
    with tqdm(desc="export", unit="B", unit_scale=True, disable=None) as bar:
        for part in parts:
            bar.update(len(part.data))
            yield part


def _export(c: memlane.Client, args: argparse.Namespace) -> int:
    if args.format == "jsonl":
        out = open(args.out, "wb") if args.out else sys.stdout.buffer  # noqa: SIM115 - stdout or a file
        try:
            for part in _progress(c.export_user_data(user_id=args.user)):
                out.write(part.data)
        finally:
            if args.out:
                out.close()
        return 0
    folder = Path(args.out or f"export-{args.user}")
    folder.mkdir(parents=True, exist_ok=True)
    for part in _progress(c.export_user_data(user_id=args.user, format=admin_pb2.EXPORT_FORMAT_PARQUET)):
        with open(folder / f"{part.kind}.parquet", "ab" if part.part else "wb") as f:
            f.write(part.data)
    print(folder)
    return 0
