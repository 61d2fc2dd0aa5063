"""Holds a call bound to an end user (a verified user token) to that user's data, for every RPC.

Every memlane request names its user in one of four ways, and this is the one place that reads them:

- ``user_id`` (CreateSession, ListSessions, WatchSessionEvents, ExportUserData, ForgetUser),
- ``caller.user_id`` (every MemoryService RPC),
- ``session_id`` (the session's RPCs, the context RPCs, ExtractMemories' source session),
- ``session.session_id`` (UpdateSession).

An empty user field is filled with the bound user, so a bound ListSessions or WatchSessionEvents lists
or follows that user only; a different one is refused. A session named by id must belong to the bound
user (a missing one is left to the handler: NOT_FOUND, or CreateSession making it for this user).
``tests/unit/test_user_binding.py`` checks that every RPC's request has one of these fields, so a new
RPC cannot slip past unbound.
"""

from __future__ import annotations

from typing import Any

from ..access.identity import Caller
from ..errors import NotFound, PermissionDenied
from ..sessions.store import SessionStore

USER_FIELDS = ("user_id", "caller.user_id")
SESSION_FIELDS = (
    "session_id",
    "session.session_id",
    "source_session_id",  # CopyCheckpoints: both threads must be the user's
    "target_session_id",
    "session_ids",  # PruneCheckpoints (repeated)
)
# RPCs that name no user in a request field: operator work on the session-end queue, refused to
# everyone but admins; ListUsers, whose handler narrows a bound call to its user; ImportUserData, whose
# user is named inside the file and held to the binding by its handler.
OPERATOR_RPCS = frozenset(
    f"memlane.v1.AdminService.{name}"
    for name in ("ListParkedJobs", "RetryParkedJobs", "ListUsers", "ImportUserData")
)
# RPCs on an agent's procedural memory (procedure.proto): they name no user because procedures are the
# agent's, not a user's. A version learned from a session names it (``source_session_id``, checked
# here); versions learned from other users' sessions are hidden from a bound call by the API.
AGENT_RPCS = frozenset(
    f"memlane.v1.ProcedureService.{name}"
    for name in ("ListProcedures", "GetProcedure", "ApproveProcedure", "RejectProcedure", "RollBackProcedure")
)
# RPCs whose reach crosses users by design (a run id may name threads of several users): refused to a
# call bound to an end user rather than answered for a subset it cannot see.
UNBOUND_ONLY = frozenset({"DeleteCheckpointRunsRequest"})


def _field(message: Any, path: str) -> tuple[Any, str] | None:
    """(the message holding the last part of ``path``, that part), if the request type has the path."""
    *parents, name = path.split(".")
    for part in parents:
        if part not in message.DESCRIPTOR.fields_by_name:
            return None
        message = getattr(message, part)
    return (message, name) if name in message.DESCRIPTOR.fields_by_name else None


def user_scoped(request: Any) -> bool:
    """Whether the request type names a user in one of the ways above."""
    return any(_field(request, p) is not None for p in (*USER_FIELDS, *SESSION_FIELDS))


class UserBinding:
    def __init__(self, sessions: SessionStore) -> None:
        self._sessions = sessions

    async def check(self, request: Any, caller: Caller) -> None:
        """Raises PermissionDenied unless every user the request names is ``caller.user_id``."""
        if not caller.user_id:
            return
        if request.DESCRIPTOR.name in UNBOUND_ONLY:
            raise PermissionDenied(
                f"{request.DESCRIPTOR.name[: -len('Request')]} spans threads of every user; a call bound"
                " to an end user may not make it"
            )
        for path in USER_FIELDS:
            found = _field(request, path)
            if found is None:
                continue
            holder, name = found
            if not getattr(holder, name):
                setattr(holder, name, caller.user_id)
            caller.check_user(getattr(holder, name), path)
        for path in SESSION_FIELDS:
            found = _field(request, path)
            if found is None:
                continue
            value = getattr(*found)
            for session_id in [value] if isinstance(value, str) else list(value):
                if not session_id:
                    continue
                try:
                    session = await self._sessions.get(session_id)
                except NotFound:
                    continue
                caller.check_user(session.user_id, path)
