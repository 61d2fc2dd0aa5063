"""The flags of ``memlane mcp`` and the identity they fix. No MCP SDK import here: ``memlane --help``
lists the command on an install without the ``mcp`` extra."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
from dataclasses import dataclass

from .._client import DEFAULT_TARGET, address_from_env

TOKEN_ENV = "MEMLANE_TOKEN"  # the caller (agent) bearer token, as for every other memlane command
USER_TOKEN_ENV = "MEMLANE_USER_TOKEN"  # a signed end-user token, when the sidecar binds users
DEFAULT_LISTEN = "127.0.0.1:8765"
HTTP_PATH = "/mcp"
DEFAULT_MAX_SESSIONS = 100
DEFAULT_SESSION_IDLE_SECONDS = 900.0
# A name --allow-remote accepts: a host name or address, optionally :PORT or :* (no scheme, no path).
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:(\d{1,5}|\*))?")


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
    # Host names (HOST, HOST:PORT, HOST:*) the HTTP endpoint answers to besides loopback ones; any makes
    # a non-loopback --listen acceptable.
    allow_remote: tuple[str, ...] = ()
    timeout: float = 30.0
    max_sessions: int = DEFAULT_MAX_SESSIONS
    session_idle_timeout: float = DEFAULT_SESSION_IDLE_SECONDS

    def __post_init__(self) -> None:
        if bool(self.user_id) == self.any_user:
            raise OptionsError(
                "say whom the tools act for: --user USER_ID (one user; the model cannot pick another) or"
                " --any-user (every tool takes a user_id argument the model fills in)"
            )
        if self.transport not in ("stdio", "http"):
            raise OptionsError(f"--transport must be stdio or http, not {self.transport!r}")
        for name in self.allow_remote:
            if not _HOST.fullmatch(name):
                raise OptionsError(
                    f"--allow-remote {name[:100]!r}: give the name clients use to reach the endpoint, as"
                    " HOST, HOST:PORT or HOST:* (no scheme, no path)"
                )
        if self.max_sessions < 1:
            raise OptionsError("--max-sessions must be at least 1")
        if not 0 < self.session_idle_timeout < 86_400 * 7:
            raise OptionsError("--session-idle-timeout must be more than 0 and less than a week (seconds)")
        if self.transport == "http":
            host, _ = split_listen(self.listen)
            if not self.allow_remote and not _is_loopback(host):
                raise OptionsError(
                    f"--listen {self.listen}: the HTTP endpoint has no authentication of its own, so anyone"
                    " who reaches it acts as this server's user; it listens on loopback unless"
                    " --allow-remote names the host clients reach it by (put it behind an authenticating"
                    " proxy)"
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
        "--address",
        "--target",
        dest="target",
        metavar="HOST:PORT",
        default=address_from_env(),
        help="the sidecar's gRPC address ($MEMLANE_ADDRESS; --target and $MEMLANE_TARGET are the older"
        f" names; default {DEFAULT_TARGET})",
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
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="a name clients reach the HTTP endpoint by (Host header; Origin http(s)://HOST), accepted"
        " besides loopback names; repeatable. Lets --listen name a non-loopback address. DNS-rebinding"
        " checks stay on: other names are refused (the endpoint has no authentication of its own)",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=DEFAULT_MAX_SESSIONS,
        help=f"most MCP sessions open at once over HTTP; more are refused with 503 (default"
        f" {DEFAULT_MAX_SESSIONS})",
    )
    parser.add_argument(
        "--session-idle-timeout",
        type=float,
        default=DEFAULT_SESSION_IDLE_SECONDS,
        help="seconds an HTTP session may go without a request before it is closed (the client then"
        f" initializes again; default {DEFAULT_SESSION_IDLE_SECONDS:g})",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline of each sidecar call, seconds")
    parser.add_argument(
        "--log-format",
        choices=["auto", "json", "text"],
        default=os.environ.get("MEMLANE_LOG_FORMAT", "auto"),
        help="stderr logs: json (one object a line, as the sidecar's), text, or auto (text on a terminal)",
    )
    parser.add_argument(
        "--log-level", default=os.environ.get("MEMLANE_LOG_LEVEL", "info"), help="default info"
    )


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
        allow_remote=tuple(args.allow_remote),
        timeout=args.timeout,
        max_sessions=args.max_sessions,
        session_idle_timeout=args.session_idle_timeout,
    )
