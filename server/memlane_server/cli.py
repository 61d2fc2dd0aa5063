"""The ``memlane`` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import sys
from collections.abc import Sequence

import memlane

from .config import ConfigError, add_flags, build_settings, flags_from
from .inspect_cli import COMMANDS as INSPECT_COMMANDS
from .inspect_cli import add_parsers as add_inspect_parsers
from .inspect_cli import run as run_inspect_command
from .ops import add_parsers as add_operator_parsers
from .ops import run as run_operator_command
from .state_cli import COMMANDS as STATE_COMMANDS
from .state_cli import add_parsers as add_state_parsers
from .state_cli import run as run_state_command


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memlane", description="memlane memory sidecar")
    parser.add_argument("--version", action="version", version=f"memlane {memlane.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the sidecar",
        usage="memlane serve [--config FILE] [--SETTING VALUE ...]",
        description="Run the memlane sidecar. Every setting is a flag, a MEMLANE_* variable and a config-file"
        " key; precedence: defaults < --config file < environment < flags.",
    )
    add_flags(serve)
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
    add_operator_parsers(sub)
    add_inspect_parsers(sub)
    add_state_parsers(sub)
    return parser


# glibc's M_ARENA_MAX: gRPC, ONNX Runtime and LanceDB run many threads, and glibc gives each thread
# its own malloc arena by default; their idle memory made the sidecar with LTM ~170 MB bigger.
_M_ARENA_MAX = -8


def _limit_malloc_arenas(arenas: int = 2) -> None:
    """Like MALLOC_ARENA_MAX=2, set before the threads start; an explicit variable wins."""
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, arenas)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("memories", "jobs", "forget-user", "export-user"):
        return run_operator_command(args)
    if args.command in INSPECT_COMMANDS:
        return run_inspect_command(args)
    if args.command in STATE_COMMANDS:
        return run_state_command(args)
    if args.command == "bench":
        from .bench.suite import run

        run(args.quick, args.redis_url, args.json_out, args.compare)
        return 0
    if args.command == "eval":
        # Imported here, like bench: the harness needs the server extras and loads the model.
        if args.eval_set == "golden":
            from .eval.golden import GoldenFileError
            from .eval.golden import run as run_golden

            try:
                return run_golden(args.file, k=args.k, threshold=args.threshold, redis_url=args.redis_url)
            except GoldenFileError as exc:
                print(f"memlane: {exc}", file=sys.stderr)
                return 2
        from .eval import run as run_eval

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
    if args.command == "serve":
        # Imported here so `memlane --help` works on a client-only install without the server extras.
        from .lazy_modules import defer_unused_packages

        defer_unused_packages()  # seconds off start-up (see the module)
        try:
            from .app import serve
            from .observability.logs import configure
        except ImportError as exc:
            print(f"memlane: the sidecar needs `pip install 'memlane[server]'` ({exc})", file=sys.stderr)
            return 2
        configure(settings.observability.log_level, settings.observability.log_format)
        _limit_malloc_arenas()
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
