"""``memlane mcp``: an MCP server (the official ``mcp`` SDK, ``pip install 'memlane[mcp]'``) that gives an
MCP client (a coding agent, a desktop assistant) memlane's memory as tools, through a running sidecar and
this package's own client, so every access rule, user binding and limit of the sidecar holds.

    memlane mcp --target 127.0.0.1:50051 --user alice            # stdio, for one user
    python -m memlane.mcp --transport http --listen 127.0.0.1:8765 --user alice

The caller token comes from ``$MEMLANE_TOKEN`` and the end-user token from ``$MEMLANE_USER_TOKEN``.
Whom the tools act for is fixed by ``--user`` (the model cannot name another user) or, for a trusted
multi-user client, left to a ``user_id`` argument with ``--any-user``. See docs/integrations.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence

from ._options import McpOptions, OptionsError, add_arguments, options_from

__all__ = ["McpOptions", "OptionsError", "add_arguments", "main", "run", "serve"]


async def serve(options: McpOptions) -> None:
    """Serves until the client disconnects (stdio) or the process is stopped (HTTP)."""
    # The SDK is imported only once a server is asked for: the flags and --help need no extra.
    from ._server import serve_http, serve_stdio  # noqa: PLC0415

    await (serve_http(options) if options.transport == "http" else serve_stdio(options))


def _plain_logs(level: str, fmt: str) -> None:
    """Logs of ``python -m memlane.mcp``, which runs without the server package: plain text on stderr
    (``memlane mcp`` logs as the sidecar does, JSON off a terminal)."""
    del fmt
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def run(args: argparse.Namespace, configure_logs: Callable[[str, str], None] | None = None) -> int:
    """Runs the server of parsed flags (``add_arguments``); the exit status. ``configure_logs(level,
    format)`` sets up logging (``memlane mcp`` passes the sidecar's)."""
    try:
        options = options_from(args)
    except OptionsError as exc:
        print(f"memlane mcp: {exc}", file=sys.stderr)
        return 2
    try:
        (configure_logs or _plain_logs)(args.log_level, args.log_format)
    except ValueError as exc:  # an unknown level
        print(f"memlane mcp: --log-level: {exc}", file=sys.stderr)
        return 2
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # The SDK logs every request at INFO ("Processing request of type ..."): debug detail here.
        logging.getLogger("mcp").setLevel(logging.WARNING)
    if importlib.util.find_spec("mcp") is None:
        print("memlane mcp: the MCP server needs `pip install 'memlane[mcp]'`", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends a foreground HTTP server
        asyncio.run(serve(options))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memlane mcp", description="memlane's memory as MCP tools")
    add_arguments(parser)
    return run(parser.parse_args(argv))
