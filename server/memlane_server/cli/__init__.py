"""The ``memlane`` command: its parser and what each subcommand runs.

The package holds the command line whole: the client subcommands (``ops.py``: users, memories, jobs;
``state.py``: health, sessions, traces, snapshots, procedures; both over ``connection.py``'s shared flags
and output), and ``start.py``, what ``serve`` and ``worker`` run once their checks passed (the worker
process's composition root among it). ``python -m memlane_server.cli`` runs it (``__main__.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from memlane.mcp import add_arguments as add_mcp_arguments

from ..build_info import version_line
from ..config import ConfigError, add_flags, build_settings, flags_from
from .ops import COMMANDS as OPERATOR_COMMANDS
from .ops import add_parsers as add_operator_parsers
from .ops import run as run_operator_command
from .state import COMMANDS as STATE_COMMANDS
from .state import add_parsers as add_state_parsers
from .state import run as run_state_command


class _VersionAction(argparse.Action):
    """``--version``: the package version and the commit, looked up only when asked (git may run)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **_: Any) -> None:
        super().__init__(
            option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help="print the version and exit"
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_line())
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """Names the closest flag for a misspelt one (Python 3.11's argparse has no suggest_on_error). The
    top-level parser reports the unknown flags of every subcommand, so it looks through all of them."""

    def _all_flags(self) -> set[str]:
        flags = {s for s in self._option_string_actions if s.startswith("--")}
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    flags |= sub._all_flags() if isinstance(sub, _Parser) else set()
        return flags

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            flags = sorted(self._all_flags())
            hints = []
            for word in message.split(":", 1)[1].split():
                if word.startswith("--"):
                    close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.7)
                    hints += [f"{word}: did you mean {close[0]}?"] if close else []
            if hints:
                message = f"{message} ({'; '.join(hints)})"
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(prog="memlane", description="memlane memory sidecar")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the sidecar",
        usage="memlane serve [--config FILE] [--SETTING VALUE ...]",
        description="Run the memlane sidecar. Every setting is a flag, a MEMLANE_* variable and a config-file"
        " key; precedence: defaults < --config file < environment < flags.",
    )
    add_flags(serve)
    worker = sub.add_parser(
        "worker",
        help="run background jobs only (session end, learning, LTM upkeep) for sidecars on the same Redis",
        usage="memlane worker [--config FILE|-] [--SETTING VALUE ...]",
        description="Run memlane's background jobs alone, against the Redis, LanceDB table and archive"
        " of the sidecars whose jobs it takes (the same settings as serve; redis_url is required)."
        " `memlane serve` starts worker_processes of these itself.",
    )
    add_flags(worker)
    worker.add_argument(
        "--parent-pid", type=int, default=0, help="stop when this process is gone (set by memlane serve)"
    )
    worker.add_argument(
        "--embedder-socket",
        default="",
        help="embed through the model process on this Unix socket (set by memlane serve)",
    )
    worker.add_argument(
        "--heartbeat-fd",
        type=int,
        default=-1,
        help="write signs of life to this inherited pipe (set by memlane serve, which watches them)",
    )
    bench = sub.add_parser("bench", help="measure a real sidecar against a bare gRPC echo")
    bench.add_argument("--quick", action="store_true", help="a short run (CI smoke)")
    bench.add_argument("--redis-url", default="", help="Redis to use (default: an embedded one)")
    bench.add_argument("--json", dest="json_out", help="also write the figures as JSON here")
    bench.add_argument(
        "--compare", metavar="REF.json", help="print each figure's ratio to an earlier --json run"
    )
    evaluate = sub.add_parser("eval", help="measure recall of a real sidecar on a benchmark file")
    eval_sets = evaluate.add_subparsers(dest="eval_set", required=True)
    locomo = eval_sets.add_parser("locomo", help="evidence recall on a LoCoMo-format file, with baselines")
    locomo.add_argument("--data", required=True, help="path of the LoCoMo-format JSON file")
    locomo.add_argument("--json", dest="json_out", help="also write the figures as JSON here")
    locomo.add_argument("--redis-url", default="", help="Redis to use (default: an embedded one)")
    locomo.add_argument(
        "--compare",
        choices=["memory-off"],
        help="also assemble each question's context with and without long-term memory (an A/B baseline)",
    )
    locomo.add_argument(
        "--leave-one-out",
        action="store_true",
        help="also tune recall knobs on all conversations but one and score the one left out, in turn",
    )
    golden = eval_sets.add_parser("golden", help="recall@k on your own golden set; exit 1 under a threshold")
    golden.add_argument(
        "--file", required=True, help="YAML golden set (format: memlane_server/eval/golden.py)"
    )
    golden.add_argument("--k", type=int, help="recall cutoff (default: the file's k, else 5)")
    golden.add_argument("--threshold", type=float, help="fail under this recall@k (default: the file's)")
    golden.add_argument("--redis-url", default="", help="Redis to use (default: an embedded one)")
    mcp = sub.add_parser(
        "mcp",
        help="serve memlane's memory as MCP tools, through a running sidecar (needs memlane[mcp])",
        description="An MCP server over stdio or streamable HTTP; tokens from $MEMLANE_TOKEN and"
        " $MEMLANE_USER_TOKEN. See docs/integrations.md.",
    )
    add_mcp_arguments(mcp)
    add_operator_parsers(sub)
    add_state_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command's exit status. A reader that stops early (``memlane trace show S | head``) ends the
    command quietly, as it ends ``git log``: exit 141 (SIGPIPE), no traceback."""
    try:
        status = _run(argv)
        sys.stdout.flush()  # inside the try: what is left in the buffer may meet the closed pipe too
        return status
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush is quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _run(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command in OPERATOR_COMMANDS:
        return run_operator_command(args)
    if args.command == "mcp":
        from memlane.mcp import run as run_mcp

        from ..observability.logs import configure as configure_logs

        return run_mcp(args, configure_logs)  # logs as the sidecar's (JSON off a terminal)
    if args.command in STATE_COMMANDS:
        return run_state_command(args)
    if args.command == "bench":
        from ..bench.suite import run

        run(args.quick, args.redis_url, args.json_out, args.compare)
        return 0
    if args.command == "eval":
        # Imported here, like bench: the harness needs the server extras and loads the model.
        if args.eval_set == "golden":
            from ..eval.golden import GoldenFileError
            from ..eval.golden import run as run_golden

            try:
                return run_golden(args.file, k=args.k, threshold=args.threshold, redis_url=args.redis_url)
            except GoldenFileError as exc:
                print(f"memlane: {exc}", file=sys.stderr)
                return 2
        from ..eval import run as run_eval

        run_eval(
            args.data,
            json_out=args.json_out,
            redis_url=args.redis_url,
            compare=args.compare or "",
            leave_one_out=args.leave_one_out,
        )
        return 0
    try:
        settings = build_settings(flags_from(args), config_file=getattr(args, "config", None))
    except ConfigError as exc:
        print(f"memlane: {exc}", file=sys.stderr)
        return 2
    if args.command in ("serve", "worker"):
        from ..heartbeat import Heartbeat

        # A worker of memlane serve gives signs of life from here on: its start takes seconds.
        heartbeat = Heartbeat(getattr(args, "heartbeat_fd", -1), settings.server.child_stall_seconds)
        # Imported here so `memlane --help` works on a client-only install without the server extras.
        from ..file_modes import keep_private
        from ..observability.logs import configure as configure_logs
        from ..preflight import START_ERRORS, check, defer_unused_packages

        keep_private()  # first: every file this process and its children make is its user's alone
        configure_logs(settings.observability.log_level, settings.observability.log_format)
        try:  # before the server's imports (seconds): a start that cannot work says so at once
            asyncio.run(check(settings, listens=args.command == "serve"))
        except START_ERRORS as exc:
            print(f"memlane: {exc}", file=sys.stderr)
            return 2

        defer_unused_packages()  # seconds off start-up (see preflight.py)
        try:
            from .start import run_process
        except ImportError as exc:
            print(f"memlane: the sidecar needs `pip install 'memlane[server]'` ({exc})", file=sys.stderr)
            return 2
        return run_process(args, settings, heartbeat)
    return 0
