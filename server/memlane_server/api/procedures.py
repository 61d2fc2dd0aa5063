"""ProcedureService: procedural memory over gRPC, and who may do what with it.

- Read (List, Get): an agent reads its own procedures and its groups' (an orchestrator also its
  delegates'); admins, auditors and the local unrestricted caller read every owner's.
- Propose: an agent for itself or one of its groups; an admin (an operator) or the local unrestricted
  caller for any owner. Auditors never.
- Approve, reject, roll back: admins only (and the local unrestricted caller): the human in the loop.
  An agent in ``auto`` approval mode needs no approval for its own proposals, but still cannot approve.
"""

from __future__ import annotations

from typing import TypeAlias

import grpc

from memlane.v1 import procedure_pb2 as ppb
from memlane.v1 import procedure_pb2_grpc as ppb_grpc

from ..access.identity import Caller, CallerRole, current_caller
from ..errors import InvalidArgument, PermissionDenied
from ..ids import check_id
from ..paging import cursor_of, decode_token, encode_token, page_size, query_fingerprint
from ..procedures import Kind, Origin, Owner, Procedure, ProcedureService, Proposal, State, Version
from ..sessions.limits import Limits, check_list
from ..sessions.store import SessionStore
from .enums import PROCEDURE_KIND, PROCEDURE_ORIGIN, PROCEDURE_STATE

_Ctx: TypeAlias = grpc.aio.ServicerContext
MAX_PAGE_SIZE = 200


def _owner(pb: ppb.ProcedureOwner, me: Caller, *, default_to_caller: bool) -> Owner:
    if pb.agent_id and pb.group:
        raise InvalidArgument("owner: name an agent_id or a group, not both")
    if pb.group:
        return Owner(group=pb.group)
    if pb.agent_id or not default_to_caller:
        return Owner(agent_id=pb.agent_id)
    return Owner(agent_id=me.agent_id)


def _sees_all(me: Caller) -> bool:
    return me.unrestricted or me.is_auditor or CallerRole.ADMIN in me.roles


def may_read(me: Caller, owner: Owner) -> bool:
    if _sees_all(me):
        return True
    if owner.group:
        return owner.group in me.groups
    return me.reads_for(owner.agent_id)


def check_propose(me: Caller, owner: Owner) -> Origin:
    """The origin ``me`` proposes a procedure of ``owner`` as (ImportUserData holds a file's versions
    to it too); PermissionDenied when it may not propose for that owner."""
    if me.unrestricted or CallerRole.ADMIN in me.roles:
        return Origin.OPERATOR
    if me.is_auditor:
        raise PermissionDenied(f"agent {me.agent_id!r} is an auditor: auditors read, they never write")
    if owner.group and owner.group not in me.groups:
        raise PermissionDenied(f"agent {me.agent_id!r} is not a member of group {owner.group!r}")
    if not owner.group and owner.agent_id != me.agent_id:
        raise PermissionDenied(
            f"agent {me.agent_id!r} may not propose procedures of agent {owner.agent_id!r}"
        )
    return Origin.AGENT


def version_to_pb(v: Version) -> ppb.ProcedureVersion:
    return ppb.ProcedureVersion(
        version=v.version,
        state=PROCEDURE_STATE.to_pb(v.state),
        kind=PROCEDURE_KIND.to_pb(v.kind),
        content=v.content,
        origin=PROCEDURE_ORIGIN.to_pb(v.origin),
        proposed_by=v.proposed_by,
        proposed_at_unix_ms=v.proposed_at_ms,
        reason=v.reason,
        decided_by=v.decided_by,
        decided_at_unix_ms=v.decided_at_ms,
        note=v.note,
        source_session_id=v.source_session_id,
        source_message_ids=v.source_message_ids,
    )


def procedure_to_pb(p: Procedure, me: Caller) -> ppb.Procedure:
    """A call bound to an end user sees no unapproved version learned from another user's session (an
    approved one is in every user's context anyway)."""
    active = p.active
    versions = [
        v
        for v in p.versions
        if not me.user_id or v.state is State.ACTIVE or v.source_user_id in ("", me.user_id)
    ]
    return ppb.Procedure(
        owner=ppb.ProcedureOwner(agent_id=p.owner.agent_id, group=p.owner.group),
        procedure_id=p.procedure_id,
        title=p.title,
        active_version=active.version if active else 0,
        versions=[version_to_pb(v) for v in versions],
        updated_at_unix_ms=p.updated_at_ms,
    )


def _query(request: ppb.ListProceduresRequest, me: Caller) -> str:
    """What a ListProcedures token is bound to: the owner and state asked for, and who asks (the owners
    a caller may read decide the listing)."""
    return query_fingerprint(
        "procedures",
        request.owner.agent_id,
        request.owner.group,
        int(request.state),
        me.agent_id,
        sorted(me.roles),
        sorted(me.groups),
        sorted(me.delegates),
        me.unrestricted,
    )


class ProcedureServicer(ppb_grpc.ProcedureServiceServicer):
    def __init__(self, procedures: ProcedureService, sessions: SessionStore, *, limits: Limits) -> None:
        self._procedures = procedures
        self._sessions = sessions
        self._limits = limits  # the configured ones (wiring/stores.py)

    async def ProposeProcedure(
        self, request: ppb.ProposeProcedureRequest, context: _Ctx
    ) -> ppb.ProposeProcedureResponse:
        me = current_caller()
        owner = _owner(request.owner, me, default_to_caller=True)
        check_id(request.procedure_id, "procedure_id")
        origin = check_propose(me, owner)
        kind = PROCEDURE_KIND.from_pb(request.kind)
        if kind is None or kind is Kind.UNSPECIFIED:
            raise InvalidArgument(f"kind must be a known ProcedureKind, got {request.kind}")
        check_list(request.source_message_ids, "source_message_ids", self._limits)
        source_user = ""
        if request.source_session_id:
            # Learned from a session: its user is recorded, so erasing the user erases this version.
            source_user = (await self._sessions.get(request.source_session_id)).user_id
        proc, version, created = await self._procedures.propose(
            Proposal(
                owner=owner,
                procedure_id=request.procedure_id,
                content=request.content,
                kind=kind,
                title=request.title,
                reason=request.reason,
                origin=origin,
                proposed_by=me.agent_id,
                source_session_id=request.source_session_id,
                source_message_ids=tuple(request.source_message_ids),
                source_user_id=source_user,
            )
        )
        return ppb.ProposeProcedureResponse(
            procedure=procedure_to_pb(proc, me), version=version, created=created
        )

    async def ListProcedures(
        self, request: ppb.ListProceduresRequest, context: _Ctx
    ) -> ppb.ListProceduresResponse:
        me = current_caller()
        size = page_size(request.page_size, default=50, maximum=MAX_PAGE_SIZE)
        state = PROCEDURE_STATE.from_pb(request.state)
        if state is None:
            raise InvalidArgument(f"state must be a known ProcedureState, got {request.state}")
        query = _query(request, me)
        cursor = decode_token(request.page_token, query)
        after = ("", "")  # the (owner tag, procedure id) of the previous page's last procedure
        if cursor is not None:
            tag, procedure_id = cursor_of(cursor, str, str)
            after = (tag, procedure_id)
        if request.owner.agent_id or request.owner.group:
            owner = _owner(request.owner, me, default_to_caller=False)
            if not may_read(me, owner):
                raise PermissionDenied("the caller may not read this owner's procedures")
            owners = [owner]
        else:
            owners = [o for o in await self._procedures.owners() if may_read(me, o)]
        procs = await self._procedures.list_procedures(owners, state)
        procs = [p for p in procs if (p.owner.tag, p.procedure_id) > after]
        procs.sort(key=lambda p: (p.owner.tag, p.procedure_id))
        page, more = procs[:size], len(procs) > size
        token = encode_token(query, [page[-1].owner.tag, page[-1].procedure_id]) if more else ""
        return ppb.ListProceduresResponse(
            procedures=[procedure_to_pb(p, me) for p in page], next_page_token=token
        )

    async def GetProcedure(self, request: ppb.GetProcedureRequest, context: _Ctx) -> ppb.GetProcedureResponse:
        me = current_caller()
        owner = _owner(request.owner, me, default_to_caller=True)
        check_id(request.procedure_id, "procedure_id")
        if not may_read(me, owner):
            raise PermissionDenied("the caller may not read this owner's procedures")
        return ppb.GetProcedureResponse(
            procedure=procedure_to_pb(await self._procedures.get(owner, request.procedure_id), me)
        )

    def _decision(self, owner_pb: ppb.ProcedureOwner, procedure_id: str, action: str) -> tuple[Caller, Owner]:
        me = current_caller()
        me.check_admin(f"{action} procedures")
        check_id(procedure_id, "procedure_id")
        return me, _owner(owner_pb, me, default_to_caller=False)

    async def ApproveProcedure(
        self, request: ppb.ApproveProcedureRequest, context: _Ctx
    ) -> ppb.ApproveProcedureResponse:
        me, owner = self._decision(request.owner, request.procedure_id, "approve")
        _positive(request.version, "version")
        proc = await self._procedures.approve(
            owner, request.procedure_id, request.version, me.agent_id, request.note
        )
        return ppb.ApproveProcedureResponse(procedure=procedure_to_pb(proc, me))

    async def RejectProcedure(
        self, request: ppb.RejectProcedureRequest, context: _Ctx
    ) -> ppb.RejectProcedureResponse:
        me, owner = self._decision(request.owner, request.procedure_id, "reject")
        _positive(request.version, "version")
        proc = await self._procedures.reject(
            owner, request.procedure_id, request.version, me.agent_id, request.note
        )
        return ppb.RejectProcedureResponse(procedure=procedure_to_pb(proc, me))

    async def RollBackProcedure(
        self, request: ppb.RollBackProcedureRequest, context: _Ctx
    ) -> ppb.RollBackProcedureResponse:
        me, owner = self._decision(request.owner, request.procedure_id, "roll back")
        if request.to_version < 0:
            raise InvalidArgument("to_version must not be negative")
        proc = await self._procedures.roll_back(
            owner, request.procedure_id, request.to_version, me.agent_id, request.note
        )
        return ppb.RollBackProcedureResponse(procedure=procedure_to_pb(proc, me))


def _positive(value: int, name: str) -> None:
    if value <= 0:
        raise InvalidArgument(f"{name} must be positive")
