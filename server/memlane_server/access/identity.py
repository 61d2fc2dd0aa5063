"""The caller of an RPC and the one visibility rule.

Visibility kinds (the values of ``memlane.v1.VisibilityKind``): 1 session-wide, 2 private to the source
agent, 3 a named group. ``Caller.can_see`` is the only place that decides whether a caller may read a
message or memory item; ``Caller.check_write`` the only place that decides whether it may write one;
``Caller.check_manage`` the only place that decides whether it may update or close a session.
"""

from __future__ import annotations

import contextvars
import enum
from dataclasses import dataclass, field

from ..errors import PermissionDenied

SESSION, AGENT, GROUP = 1, 2, 3


class CallerRole(enum.StrEnum):
    AGENT = "agent"  # reads session-wide data, its own private data and its groups'
    ORCHESTRATOR = "orchestrator"  # also reads the private data of the agents it delegates to
    AUDITOR = "auditor"  # reads everything, writes nothing
    ADMIN = "admin"  # an operator: exports and erases users (AdminService)


@dataclass(frozen=True, slots=True)
class Caller:
    agent_id: str
    roles: frozenset[CallerRole] = frozenset({CallerRole.AGENT})
    groups: frozenset[str] = frozenset()
    delegates: frozenset[str] = frozenset()  # agents an orchestrator may read for
    how: str = "token"  # token | mtls | header | local
    # A local caller with auth disabled and no agent header: a single-agent pod in development.
    unrestricted: bool = field(default=False)
    # The end user this call is bound to by a verified user token ("" = not bound; see policy.py).
    user_id: str = ""

    @property
    def is_auditor(self) -> bool:
        return CallerRole.AUDITOR in self.roles

    def check_admin(self, action: str, *, auditors_too: bool = False) -> None:
        if self.unrestricted or CallerRole.ADMIN in self.roles or (auditors_too and self.is_auditor):
            return
        raise PermissionDenied(f"agent {self.agent_id!r} may not {action}: it needs the admin role")

    def check_user(self, user_id: str, field_name: str) -> None:
        """A call bound to an end user touches that user's data only."""
        if self.user_id and user_id != self.user_id:
            raise PermissionDenied(f"{field_name} is not the end user this call is bound to (its user token)")

    def reads_for(self, agent_id: str) -> bool:
        """May this caller read ``agent_id``'s private data?"""
        if self.unrestricted or self.is_auditor or agent_id == self.agent_id:
            return True
        return CallerRole.ORCHESTRATOR in self.roles and agent_id in self.delegates

    def can_see(self, visibility: int, source_agent_id: str, group: str) -> bool:
        if self.unrestricted or self.is_auditor:
            return True
        if visibility == AGENT:
            return self.reads_for(source_agent_id)
        if visibility == GROUP:
            return group in self.groups or (
                CallerRole.ORCHESTRATOR in self.roles and source_agent_id in self.delegates
            )
        return True  # session-wide

    def check_manage(self, owner_agent_id: str, group: str, action: str) -> None:
        """May this caller change or close a session created by ``owner_agent_id`` (``group``: the group it
        would then belong to, "" for none)? Its creating agent may, an orchestrator for the agents it
        delegates to may, an admin may; auditors and every other agent may not. A session made without
        an agent (auth off, no agent header) is managed by admins only once auth is on."""
        if self.unrestricted:
            return
        if self.is_auditor:
            raise PermissionDenied(f"agent {self.agent_id!r} is an auditor: auditors read, they never write")
        if CallerRole.ADMIN not in self.roles:
            owns = bool(owner_agent_id) and owner_agent_id == self.agent_id
            delegated = CallerRole.ORCHESTRATOR in self.roles and owner_agent_id in self.delegates
            if not (owns or delegated):
                raise PermissionDenied(
                    f"agent {self.agent_id!r} may not {action} a session of agent {owner_agent_id!r}: only "
                    "its creating agent, an orchestrator it delegates for, or an admin may"
                )
            if group and group not in self.groups:
                raise PermissionDenied(f"agent {self.agent_id!r} is not a member of group {group!r}")

    def check_write(self, visibility: int, source_agent_id: str, group: str, field_name: str) -> None:
        """Raises PermissionDenied for a write this caller may not make."""
        if self.unrestricted:
            return
        if self.is_auditor:
            raise PermissionDenied(f"agent {self.agent_id!r} is an auditor: auditors read, they never write")
        if source_agent_id and source_agent_id != self.agent_id:
            raise PermissionDenied(
                f"{field_name}.source_agent_id {source_agent_id!r} is not the calling agent {self.agent_id!r}"
            )
        if visibility == GROUP and group not in self.groups:
            raise PermissionDenied(
                f"{field_name}: agent {self.agent_id!r} is not a member of group {group!r}"
            )


UNRESTRICTED = Caller(agent_id="", roles=frozenset(), how="local", unrestricted=True)

# No default: a handler that runs without an authenticated caller is a bug, and must fail closed.
_current: contextvars.ContextVar[Caller] = contextvars.ContextVar("memlane_caller")


def current_caller() -> Caller:
    """The caller of the RPC being served (set by the API boundary for the handler's task)."""
    try:
        return _current.get()
    except LookupError:
        raise PermissionDenied("no authenticated caller for this call") from None


CallerToken = contextvars.Token[Caller]


def enter_caller(caller: Caller) -> CallerToken:
    """Makes ``caller`` current for this task; undo with ``exit_caller``."""
    return _current.set(caller)


def exit_caller(token: CallerToken) -> None:
    _current.reset(token)
