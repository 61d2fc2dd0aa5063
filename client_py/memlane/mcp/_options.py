"""The flags of ``memlane mcp`` and the identity they fix. No MCP SDK import here: ``memlane --help``
lists the command on an install without the ``mcp`` extra."""

from __future__ import annotations

import argparse
import ipaddress
import os
from dataclasses import dataclass

from .._client import DEFAULT_TARGET

TOKEN_ENV = "MEMLANE_TOKEN"  # the caller (agent) bearer token, as for every other memlane command
USER_TOKEN_ENV = "MEMLANE_USER_TOKEN"  # a signed end-user token, when the sidecar binds users
DEFAULT_LISTEN = "127.0.0.1:8765"
HTTP_PATH = "/mcp"


class OptionsError(ValueError):
    """Flags that do not make a safe server (the message says which and why)."""


@dataclass(frozen=True)
class McpOptions:
    """Who the server acts for and how it is reached.

    ``user_id`` set: every tool acts for that user and no tool takes a user argument (the model cannot
    name another). ``user_id`` empty with ``any_user``: every tool takes a required ``user_id`` argument,
    for a trusted client that serves many users; the model then chooses."""

    target: str = DEFAULT_TARGET
    token: str | None = None
    user_token: str | None = None
    user_id: str = ""
    any_user: bool = False
    agent_id: str = "mcp"
    channel: str = "mcp"
    transport: str = "stdio"
    listen: str = DEFAULT_LISTEN
    allow_remote: bool = False
    timeout: float = 30.0

    def __post_init__(self) -> None:
        if bool(self.user_id) == self.any_user:
            raise OptionsError(
                "say whom the tools act for: --user USER_ID (one user; the model cannot pick another) or"
                " --any-user (every tool takes a user_id argument the model fills in)"
            )
        if self.transport not in ("stdio", "http"):
            raise OptionsError(f"--transport must be stdio or http, not {self.transport!r}")
        if self.transport == "http":
            host, _ = split_listen(self.listen)
            if not self.allow_remote and not _is_loopback(host):
                raise OptionsError(
                    f"--listen {self.listen}: the HTTP endpoint has no authentication of its own, so anyone"
                    " who reaches it acts as this server's user; it listens on loopback unless"
                    " --allow-remote says otherwise (put it behind an authenticating proxy)"
                )


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as host and port."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise OptionsError(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default=os.environ.get("MEMLANE_TARGET", DEFAULT_TARGET),
        help=f"the sidecar's gRPC address ($MEMLANE_TARGET, default {DEFAULT_TARGET})",
    )
    who = parser.add_mutually_exclusive_group()
    who.add_argument(
        "--user",
        dest="user_id",
        default=os.environ.get("MEMLANE_MCP_USER", ""),
        help="act for this user only: no tool takes a user argument ($MEMLANE_MCP_USER)",
    )
    who.add_argument(
        "--any-user",
        action="store_true",
        help="every tool takes a required user_id argument: the model picks the user (trusted clients only)",
    )
    parser.add_argument("--agent", dest="agent_id", default="mcp", help="agent id of writes (default mcp)")
    parser.add_argument("--channel", default="mcp", help="channel of the sessions it creates (default mcp)")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        help=f"HOST:PORT of the streamable HTTP endpoint, path {HTTP_PATH} (default {DEFAULT_LISTEN}; port 0:"
        " any free port, printed on stderr)",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="let --listen name a non-loopback address (the endpoint has no authentication of its own)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline of each sidecar call, seconds")


def options_from(args: argparse.Namespace) -> McpOptions:
    """The options of parsed flags; the tokens come from the environment only (never a flag, so they
    stay out of process listings and MCP client configs' argument lists)."""
    return McpOptions(
        target=args.target,
        token=os.environ.get(TOKEN_ENV) or None,
        user_token=os.environ.get(USER_TOKEN_ENV) or None,
        user_id=args.user_id,
        any_user=args.any_user,
        agent_id=args.agent_id,
        channel=args.channel,
        transport=args.transport,
        listen=args.listen,
        allow_remote=args.allow_remote,
        timeout=args.timeout,
    )
