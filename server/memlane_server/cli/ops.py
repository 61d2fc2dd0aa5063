"""Operator commands (``memlane users``, ``memories``, ``jobs``, ``forget-user``, ``export-user``,
``import-user``): thin wrappers over the public client against a running sidecar, so they obey the same
auth and policy as any agent."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from google.protobuf import field_mask_pb2

import memlane
from memlane._json import enum_names, to_json
from memlane.v1 import admin_pb2, memory_pb2

from .connection import add_connection, client, failed, say
from .terminal import json_line, shown

_KINDS = enum_names(memory_pb2.MemoryKind)
_SCOPES = enum_names(memory_pb2.MemoryScope)
COMMANDS = ("memories", "jobs", "forget-user", "export-user", "import-user", "users")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    users = sub.add_parser("users", help="the users memlane holds data about")
    usub = users.add_subparsers(dest="users_command", required=True)
    uls = usub.add_parser("list", help="users by id, with their sessions and memories (admins, auditors)")
    add_connection(uls)
    uls.add_argument("--query", default="", help="only ids containing this text (any case)")
    uls.add_argument("--limit", type=int, default=50, help="at most this many (default %(default)s)")
    uls.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")

    memories = sub.add_parser("memories", help="list, search, edit, merge or delete a user's memories")
    msub = memories.add_subparsers(dest="memories_command", required=True)
    ls = msub.add_parser("list", help="newest first, or the best matches of --query (a table, or --json)")
    edit = msub.add_parser("edit", help="change one memory (kept as a version: who, when, why)")
    merge = msub.add_parser("merge", help="fold memories into the first one named; the others are superseded")
    rm = msub.add_parser("delete", help="delete one memory")
    for p in (ls, edit, merge, rm):
        add_connection(p)
        p.add_argument("--user", required=True)
        p.add_argument("--agent", default="", help="the view of this agent (default: the whole user)")
    ls.add_argument("--kind", action="append", choices=sorted(_KINDS), help="only this kind (repeatable)")
    ls.add_argument("--query", default="", help="hybrid recall, as SearchMemories ranks it")
    ls.add_argument("--min-score", type=float, default=0.0, help="with --query: leave out weaker matches")
    ls.add_argument("--retired", action="store_true", help="without --query: superseded and retired too")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default %(default)s)")
    ls.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    edit.add_argument("memory_id", metavar="MEMORY_ID")
    edit.add_argument("--content", help="the new text (embedded again)")
    edit.add_argument("--kind", choices=sorted(_KINDS))
    edit.add_argument("--slot", help="the single-valued attribute it states ('' for none)")
    edit.add_argument("--scope", choices=sorted(_SCOPES))
    edit.add_argument(
        "--valid-until", metavar="WHEN", help="ISO date or time (UTC) it stops being served, or 'never'"
    )
    merge.add_argument("memory_ids", metavar="MEMORY_ID", nargs="+", help="the first is kept")
    merge.add_argument("--content", default="", help="the merged text (default: the first memory's)")
    rm.add_argument("memory_id", metavar="MEMORY_ID")
    forget = sub.add_parser("forget-user", help="erase a user everywhere (Redis, LanceDB, archives)")
    add_connection(forget)
    forget.add_argument("user")
    for p in (merge, rm, forget):
        p.add_argument(
            "--yes", action="store_true", help="do not ask (required when stdin is not a terminal)"
        )
    jobs = sub.add_parser("jobs", help="session-end jobs parked after repeated failures")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True)
    parked = jsub.add_parser("list-parked", help="one JSON object per line")
    retry = jsub.add_parser("retry-parked", help="queue parked jobs again")
    for p in (parked, retry):
        add_connection(p)
    retry.add_argument(
        "parked_ids", metavar="PARKED_ID", nargs="*", help="the jobs' parked_id (see list-parked)"
    )
    retry.add_argument("--all", action="store_true", help="every parked job")
    export = sub.add_parser(
        "export-user", help="everything held about a user (docs/operations.md#export-format)"
    )
    add_connection(export)
    export.add_argument("user")
    export.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    export.add_argument("--out", help="a file (jsonl; default stdout) or a directory (parquet)")
    imp = sub.add_parser("import-user", help="restore a user from an export-user file (admins)")
    add_connection(imp)
    imp.add_argument("file", metavar="FILE", help="a JSON lines file written by export-user ('-': stdin)")
    imp.add_argument("--merge", action="store_true", help="add to a user who already has data here")


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
    elif args.command == "memories" and args.memories_command == "merge":
        what = f"merge {len(args.memory_ids)} memories of user {args.user!r} into {args.memory_ids[0]!r}"
    else:
        what = ""
    problem = _check_args(args)
    if problem:
        say(problem)
        return 2
    if what and not confirmed(args, what):
        return 2
    with client(args, timeout=600) as c:
        try:
            if args.command == "memories":
                return _memories(c, args)
            if args.command == "users":
                return _users(c, args)
            if args.command == "jobs":
                return _jobs(c, args)
            if args.command == "forget-user":
                return _forget(c, args)
            if args.command == "import-user":
                return _import(c, args)
            return _export(c, args)
        except memlane.MemlaneError as exc:
            return failed(exc)


def _check_args(args: argparse.Namespace) -> str:
    """What the command line itself gets wrong, in the command's words (before any call)."""
    if getattr(args, "limit", 1) < 1:
        return "--limit must be at least 1"
    if args.command == "jobs" and args.jobs_command == "retry-parked":
        if args.parked_ids and args.all:
            return "retry-parked: name PARKED_ID arguments or pass --all, not both"
        if not args.parked_ids and not args.all:
            return (
                "retry-parked: name the PARKED_ID of each job to retry (see jobs list-parked), or pass --all"
            )
    if args.command == "memories" and args.memories_command == "edit":
        if all(getattr(args, f) is None for f in ("content", "kind", "slot", "scope", "valid_until")):
            return "memories edit: name what to change: --content, --kind, --slot, --scope or --valid-until"
        if args.valid_until not in (None, "never") and _when(args.valid_until) is None:
            return f"--valid-until: {args.valid_until!r} is not an ISO date or time, nor 'never'"
    if args.command == "memories" and args.memories_command == "merge" and len(args.memory_ids) < 2:
        return "memories merge: name at least two MEMORY_ID arguments (the first is kept)"
    if args.command == "memories" and args.memories_command == "list":
        if args.min_score and not args.query:
            return "--min-score ranks matches of --query; pass --query too"
        if args.retired and args.query:
            return "--retired lists retired memories; recall (--query) never serves them"
    return ""


def _when(text: str) -> int | None:
    """Milliseconds since the epoch of an ISO date or time (UTC when no zone is given)."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


def _emit(rows: list[dict[str, Any]], columns: tuple[str, ...], as_json: bool) -> None:
    """JSON lines, or a table with a header row (tabs between columns, one line per row)."""
    if as_json:
        for row in rows:
            print(json_line(row))
        return
    print("\t".join(c.upper() for c in columns))
    for row in rows:
        print("\t".join(shown(row.get(c, "")) for c in columns))


def _memories(c: memlane.Client, args: argparse.Namespace) -> int:
    caller = memory_pb2.Caller(user_id=args.user, agent_id=args.agent)
    cmd = args.memories_command
    if cmd == "delete":
        c.delete_memory(caller=caller, memory_id=args.memory_id)
        return 0
    if cmd == "merge":
        out = c.merge_memories(caller=caller, memory_ids=args.memory_ids, content=args.content)
        print(json_line({**_memory_row(out.memory), "superseded_ids": list(out.superseded_ids)}))
        return 0
    if cmd == "edit":
        return _edit(c, caller, args)
    kinds = [_KINDS[k] for k in args.kind or []]
    rows: list[dict[str, Any]] = []
    if args.query:
        found = c.search_memories(
            caller=caller,
            query=args.query,
            limit=min(args.limit, 100),
            min_score=args.min_score,
            filter=memory_pb2.MemoryFilter(kinds=kinds),
        ).results
        rows = [{**_memory_row(h.memory), "score": round(h.score, 4)} for h in found]
    else:
        flt = memory_pb2.MemoryFilter(kinds=kinds, include_retired=args.retired)
        pages = memlane.iter_pages(
            lambda t: c.list_memories(
                caller=caller, filter=flt, page_size=min(args.limit, 500), page_token=t
            ),
            "memories",
        )
        for item in pages:
            if len(rows) >= args.limit:
                break
            rows.append(_memory_row(item))
    if not rows:
        say(f"no memories of user {args.user!r}" + (f" match {args.query!r}" if args.query else ""))
        return 0
    columns = (
        ("memory_id", "kind", "slot", "score", "content")
        if args.query
        else ("memory_id", "kind", "slot", "content")
    )
    _emit(rows, columns, args.json)
    return 0


def _memory_row(m: memory_pb2.Memory) -> dict[str, Any]:
    row = to_json(m)
    row.setdefault("slot", "")  # the table's column, and scripts may read it on every row
    return row


def _edit(c: memlane.Client, caller: memory_pb2.Caller, args: argparse.Namespace) -> int:
    memory = memory_pb2.Memory(memory_id=args.memory_id)
    paths: list[str] = []
    if args.content is not None:
        memory.content, paths = args.content, [*paths, "content"]
    if args.kind is not None:
        memory.kind, paths = _KINDS[args.kind], [*paths, "kind"]
    if args.slot is not None:
        memory.slot, paths = args.slot, [*paths, "slot"]
    if args.scope is not None:
        memory.scope, paths = _SCOPES[args.scope], [*paths, "scope"]
    if args.valid_until is not None:
        memory.valid_until_unix_ms = 0 if args.valid_until == "never" else _when(args.valid_until) or 0
        paths.append("valid_until_unix_ms")
    out = c.update_memory(caller=caller, memory=memory, update_mask=field_mask_pb2.FieldMask(paths=paths))
    print(json_line(_memory_row(out.memory)))
    return 0


def _users(c: memlane.Client, args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    pages = memlane.iter_pages(
        lambda t: c.list_users(query=args.query, page_size=min(args.limit, 500), page_token=t), "users"
    )
    for u in pages:
        if len(rows) >= args.limit:
            break
        rows.append(
            {
                "user_id": u.user_id,
                "sessions": u.session_count,
                "memories": u.memory_count,
                "last_session": _iso(u.last_session_at_unix_ms),
            }
        )
    if not rows:
        say("no users" + (f" match {args.query!r}" if args.query else " hold data here"))
        return 0
    _emit(rows, ("user_id", "sessions", "memories", "last_session"), args.json)
    return 0


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds") if ms else ""


def _forget(c: memlane.Client, args: argparse.Namespace) -> int:
    receipt = c.forget_user(user_id=args.user)
    # Every key on every answer, an empty list too: a script reads operator_actions to know it is done.
    out = {
        "user_id": receipt.user_id,
        "erased": dict(sorted(receipt.erased.items())),
        "rewritten": list(receipt.rewritten),
        "operator_actions": list(receipt.operator_actions),
        "completed_at_unix_ms": receipt.completed_at_unix_ms,
    }
    print(json_line(out))
    for action in receipt.operator_actions:  # the erasure is not complete until these are done
        say(f"operator action needed: {action}")
    return 0


def _jobs(c: memlane.Client, args: argparse.Namespace) -> int:
    if args.jobs_command == "list-parked":
        listed = 0
        for job in memlane.iter_pages(lambda t: c.list_parked_jobs(page_size=500, page_token=t), "jobs"):
            print(json_line(to_json(job)))
            listed += 1
        if not listed:
            say("no parked jobs")
        return 0
    out = c.retry_parked_jobs(parked_ids=args.parked_ids, all=args.all)
    for job in out.retried:
        print(f"retried\t{shown(job.parked_id)}\t{shown(job.session_id)}")
    for pid in out.not_parked:
        print(f"not parked\t{shown(pid)}")
    if not out.retried and not out.not_parked:
        say("no parked jobs to retry")
    return 0


# One call's share of a file: under the server's default 16 MiB message limit with room to spare.
_IMPORT_BYTES = 8 << 20


def _import(c: memlane.Client, args: argparse.Namespace) -> int:
    """The file in one call, or in parts of whole lines (each starting with the header) under one
    upload id: the sidecar holds the parts and checks and imports the file whole when the last is in,
    so a large file is all-or-nothing like a small one."""
    data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    header, _, body = data.lstrip().partition(b"\n")
    parts = list(_chunks(body, _IMPORT_BYTES))
    if len(parts) == 1:
        out = c.import_user_data(data=header + b"\n" + parts[0], merge=args.merge)
    else:
        upload = uuid.uuid4().hex
        for i, part in enumerate(parts):
            out = c.import_user_data(
                data=header + b"\n" + part,
                merge=args.merge,
                upload_id=upload,
                part=i,
                more=i < len(parts) - 1,
            )
    totals = {
        "imported": dict(sorted(out.imported.items())),
        "skipped": dict(sorted(out.skipped.items())),
        "not_restored": dict(sorted(out.not_restored.items())),
    }
    print(json_line({"user_id": out.user_id, **totals}))
    if not totals["imported"]:
        say(
            f"nothing new imported for user {out.user_id!r}"
            + (" (every record was held already)" if totals["skipped"] else "")
        )
    return 0


def _chunks(body: bytes, limit: int) -> Iterator[bytes]:
    """Whole lines, at most ``limit`` bytes a chunk (a longer line goes alone); one empty chunk for an
    empty body, so the header is still sent and checked."""
    chunk = bytearray()
    for line in body.splitlines(keepends=True):
        if chunk and len(chunk) + len(line) > limit:
            yield bytes(chunk)
            chunk.clear()
        chunk += line
    yield bytes(chunk)


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
        written = 0
        out = open(args.out, "wb") if args.out else sys.stdout.buffer  # noqa: SIM115 - stdout or a file
        try:
            for part in _progress(c.export_user_data(user_id=args.user)):
                out.write(part.data)
                written += len(part.data)
        finally:
            if args.out:
                out.close()
        if not written:
            say(f"no data held about user {args.user!r}; nothing exported")
        return 0
    folder = Path(args.out or f"export-{args.user}")
    folder.mkdir(parents=True, exist_ok=True)
    for part in _progress(c.export_user_data(user_id=args.user, format=admin_pb2.EXPORT_FORMAT_PARQUET)):
        with open(folder / f"{part.kind}.parquet", "ab" if part.part else "wb") as f:
            f.write(part.data)
    print(shown(folder))
    return 0
