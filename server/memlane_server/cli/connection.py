"""What every client subcommand of ``memlane`` shares: one flag for the sidecar's address (``--address``,
``$MEMLANE_ADDRESS``; ``--target`` and ``$MEMLANE_TARGET``, the names older docs use, still work; ``serve``
takes ``--address`` for the address it listens on), the token, and how results and errors are told:
an empty result is said on stderr (stdout stays for what scripts parse), an error names the flag at
fault in the command's own words, not the request field's."""

from __future__ import annotations

import argparse
import os
import sys

import memlane

from .terminal import shown

# Request fields as the commands' flags name them (the server names the field at fault: err.field).
_FLAGS = {
    "user_id": "--user",
    "caller.user_id": "--user",
    "caller.agent_id": "--agent",
    "agent_id": "--agent",
    "query": "--query",
    "limit": "--limit",
    "page_size": "--limit",
    "min_score": "--min-score",
    "content": "--content",
    "memory.content": "--content",
    "memory.kind": "--kind",
    "memory.slot": "--slot",
    "memory.scope": "--scope",
    "memory.valid_until_unix_ms": "--valid-until",
    "memory_id": "MEMORY_ID",
    "memory.memory_id": "MEMORY_ID",
    "memory_ids": "MEMORY_ID",
    "session_id": "SESSION_ID",
    "parked_ids": "PARKED_ID",
    "data": "FILE",
    "slot": "--slot",
    "kind": "--kind",
}


def add_connection(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--address",
        "--target",
        dest="address",
        metavar="HOST:PORT",
        default=memlane.address_from_env(),
        help="gRPC address of the sidecar ($MEMLANE_ADDRESS; --target and $MEMLANE_TARGET are the older"
        " names; default %(default)s)",
    )
    p.add_argument("--token", default=os.environ.get("MEMLANE_TOKEN"), help="bearer token ($MEMLANE_TOKEN)")


def client(args: argparse.Namespace, timeout: float) -> memlane.Client:
    return memlane.Client(args.address, token=args.token, timeout=timeout)


def say(message: str) -> None:
    """A note for the person at the terminal (an empty result, a confirmation), on stderr."""
    print(f"memlane: {shown(message)}", file=sys.stderr)  # it may quote stored text or a server's words


def flag_for(field: str) -> str:
    """The flag or argument that sets a request field (``memory_ids[1]`` -> ``MEMORY_ID``)."""
    base = field.split("[", 1)[0]
    return _FLAGS.get(field) or _FLAGS.get(base) or ""


def failed(exc: memlane.MemlaneError) -> int:
    """Prints the error as the command's (``memlane: --user: ...``); exit status 1."""
    flag = flag_for(exc.field or "")
    where = f"{flag}: " if flag else ""
    say(f"{where}{exc.message} ({type(exc).__name__})")
    return 1
