"""The ``memlane`` command."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from .config import ConfigError, add_flags, build_settings, flags_from


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memlane", description="memlane memory sidecar")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the sidecar")
    add_flags(serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = build_settings(flags_from(args), config_file=getattr(args, "config", None))
    except ConfigError as exc:
        print(f"memlane: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        # Imported here so `memlane --help` works on a client-only install without the server extras.
        try:
            from .app import serve  # noqa: PLC0415
            from .observability.logs import configure  # noqa: PLC0415
        except ImportError as exc:
            print(f"memlane: the sidecar needs `pip install 'memlane[server]'` ({exc})", file=sys.stderr)
            return 2
        configure(settings.log_level, settings.log_format)
        try:
            import uvloop  # noqa: PLC0415

            uvloop.install()
        except ImportError:
            pass
        asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
