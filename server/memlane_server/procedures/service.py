"""The life of a procedure: propose, approve, reject, roll back; what assembly injects; erasure/export;
and the extractor that proposes one from a successful session (at the end of this module).

State machine of one version (only ACTIVE is ever injected; at most one version is ACTIVE):

    PROPOSED --approve--> ACTIVE --(another approved)--> SUPERSEDED
    PROPOSED --reject---> REJECTED            ACTIVE --roll back--> ROLLED_BACK
    SUPERSEDED | ROLLED_BACK --(rollback targets it)--> ACTIVE

Every change is a compare-and-swap of the procedure's document (``ProcedureStore.swap``), retried a few
times on a concurrent change, so two approvals racing cannot leave two active versions. Access rules
(who may propose, decide, read) are the API's (``api/procedures.py``); this module trusts its caller.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..errors import Conflict, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from ..sessions.model import Message, Role, Session, VisibilityKind
from .store import (
    ONCE_ACTIVE,
    ActiveProcedure,
    Kind,
    Origin,
    Owner,
    Procedure,
    ProcedureStore,
    State,
    Version,
)

MAX_CONTENT_CHARS = 4000
MAX_TITLE_CHARS = 200
MAX_REASON_CHARS = 1000
MAX_VERSIONS = 100  # per procedure: every version is kept for audit, so the count is bounded
MAX_PER_OWNER = 200
_SWAP_ATTEMPTS = 8

# Returns the kinds of personal data found in a text (empty when clean); app.py injects the PII rule.
ContentGuard = Callable[[str], list[str]]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Proposal:
    owner: Owner
    procedure_id: str
    content: str
    kind: Kind = Kind.ROUTINE
    title: str = ""
    reason: str = ""
    origin: Origin = Origin.AGENT
    proposed_by: str = ""
    source_session_id: str = ""
    source_message_ids: tuple[str, ...] = ()
    source_user_id: str = ""


class ProcedureService:
    def __init__(
        self,
        store: ProcedureStore,
        *,
        auto_approve: Callable[[Owner], bool],
        guard: ContentGuard | None = None,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self._store = store
        # Whether an owner's proposals become active without an operator (setting / access policy).
        self._auto = auto_approve
        self._guard = guard
        self._clock = clock

    @property
    def store(self) -> ProcedureStore:
        return self._store

    async def propose(self, p: Proposal) -> tuple[Procedure, int, bool]:
        """(the procedure, the proposed version, whether it is new). Equal content: the existing version."""
        content = self.check(p)
        # The extractor's versions always wait for a human: a transcript excerpt from one user's session
        # must not reach every other user's context unseen.
        auto = p.origin is not Origin.EXTRACTOR and self._auto(p.owner)
        outcome: tuple[int, bool] = (0, False)

        def change(proc: Procedure | None, now: int) -> Procedure:
            nonlocal outcome
            if proc is None:
                proc = Procedure(p.owner, p.procedure_id, (p.title or p.procedure_id)[:MAX_TITLE_CHARS])
            same = next((v for v in proc.versions if v.content == content and v.kind is p.kind), None)
            if same is not None:
                outcome = (same.version, False)
                return proc
            if len(proc.versions) >= MAX_VERSIONS:
                raise ResourceExhausted(f"procedure {p.procedure_id!r} has {MAX_VERSIONS} versions")
            number = proc.latest + 1
            proc.versions.append(
                Version(
                    number,
                    State.PROPOSED,
                    p.kind,
                    content,
                    p.origin,
                    p.proposed_by,
                    now,
                    reason=p.reason[:MAX_REASON_CHARS],
                    source_session_id=p.source_session_id,
                    source_message_ids=list(p.source_message_ids)[:64],
                    source_user_id=p.source_user_id,
                )
            )
            if p.title:
                proc.title = p.title[:MAX_TITLE_CHARS]
            if auto:
                _activate(proc, number, by=p.proposed_by, note="auto-approved", now=now)
            outcome = (number, True)
            return proc

        proc = await self._change(p.owner, p.procedure_id, change, create=True)
        version, created = outcome
        if created and p.source_user_id:
            await self._store.add_source(p.source_user_id, p.owner, p.procedure_id, version)
        return proc, version, created

    async def approve(
        self, owner: Owner, procedure_id: str, version: int, by: str, note: str = ""
    ) -> Procedure:
        def change(proc: Procedure | None, now: int) -> Procedure:
            assert proc is not None
            target = proc.version(version)
            if target.state is State.ACTIVE:
                return proc  # approving twice changes nothing
            if target.state is not State.PROPOSED:
                raise FailedPrecondition(f"version {version} is {target.state.name.lower()}, not proposed")
            _activate(proc, version, by=by, note=note, now=now)
            return proc

        return await self._change(owner, procedure_id, change)

    async def reject(
        self, owner: Owner, procedure_id: str, version: int, by: str, note: str = ""
    ) -> Procedure:
        def change(proc: Procedure | None, now: int) -> Procedure:
            assert proc is not None
            target = proc.version(version)
            if target.state is not State.PROPOSED:
                raise FailedPrecondition(f"version {version} is {target.state.name.lower()}, not proposed")
            _decide(target, State.REJECTED, by, note, now)
            return proc

        return await self._change(owner, procedure_id, change)

    async def roll_back(
        self, owner: Owner, procedure_id: str, to_version: int, by: str, note: str = ""
    ) -> Procedure:
        def change(proc: Procedure | None, now: int) -> Procedure:
            assert proc is not None
            current = proc.active
            if current is None:
                raise FailedPrecondition(f"procedure {procedure_id!r} has no active version to roll back")
            if to_version:
                target: Version | None = proc.version(to_version)
                assert target is not None
                if target.version >= current.version or target.state not in ONCE_ACTIVE:
                    raise FailedPrecondition(f"version {to_version} is not an earlier, once-approved version")
            else:
                earlier = [v for v in proc.versions if v.version < current.version and v.state in ONCE_ACTIVE]
                target = max(earlier, key=lambda v: v.decided_at_ms, default=None)
            _decide(current, State.ROLLED_BACK, by, note, now)
            if target is not None:
                _decide(target, State.ACTIVE, by, note or f"rolled back from version {current.version}", now)
            return proc

        return await self._change(owner, procedure_id, change)

    async def get(self, owner: Owner, procedure_id: str) -> Procedure:
        proc, _ = await self._store.read(owner, procedure_id)
        if proc is None:
            raise NotFound(f"procedure {procedure_id!r} not found")
        return proc

    async def list_procedures(
        self, owners: Sequence[Owner], state: State = State.UNSPECIFIED
    ) -> list[Procedure]:
        out: list[Procedure] = []
        for owner in owners:
            for proc in await self._store.of_owner(owner):
                if not state or any(v.state is state for v in proc.versions):
                    out.append(proc)
        return out

    async def owners(self) -> list[Owner]:
        return await self._store.owners()

    async def active(self, owners: Sequence[Owner]) -> list[ActiveProcedure]:
        return await self._store.active(owners)

    async def for_agent(self, agent_id: str, groups: Sequence[str]) -> list[ActiveProcedure]:
        """Assembly's ``ProcedureSource``: the active versions of this agent's and these groups'
        procedures, and of nobody else's."""
        owners = [Owner(agent_id=agent_id), *(Owner(group=g) for g in dict.fromkeys(groups) if g)]
        return await self._store.active(owners)

    # --- per-user data: versions learned from a user's sessions

    async def export_user(self, user_id: str) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for owner, pid, number in await self._store.sources(user_id):
            proc, _ = await self._store.read(owner, pid)
            version = next((v for v in proc.versions if v.version == number), None) if proc else None
            if proc is not None and version is not None:
                out.append({"owner": owner.tag, "procedure_id": pid, "title": proc.title, **_record(version)})
        return out

    async def erase_user(self, user_id: str) -> int:
        """Removes every version learned from the user's sessions (an active one stops being injected;
        the procedure falls back to nothing, never to an older version nobody re-approved)."""
        erased = 0
        for owner, pid, number in await self._store.sources(user_id):

            def change(proc: Procedure | None, now: int, number: int = number) -> Procedure | None:
                nonlocal erased
                if proc is None:
                    return None
                kept = [v for v in proc.versions if v.version != number]
                erased += len(proc.versions) - len(kept)
                return replace(proc, versions=kept, updated_at_ms=now) if kept else None

            await self._change(owner, pid, change, create=True, allow_delete=True)
        await self._store.drop_sources(user_id)
        return erased

    # --- internals

    async def _change(
        self,
        owner: Owner,
        procedure_id: str,
        change: Callable[..., Procedure | None],
        *,
        create: bool = False,
        allow_delete: bool = False,
    ) -> Procedure:
        for _ in range(_SWAP_ATTEMPTS):
            proc, raw = await self._store.read(owner, procedure_id)
            if proc is None and not create:
                raise NotFound(f"procedure {procedure_id!r} not found")
            if proc is None and not allow_delete and await self._store.count(owner) >= MAX_PER_OWNER:
                raise ResourceExhausted(f"this owner already has {MAX_PER_OWNER} procedures")
            now = self._clock()
            new = change(proc, now)
            if new is None:
                if not allow_delete or proc is None:
                    return Procedure(owner, procedure_id, "")
            else:
                new.updated_at_ms = now
            if await self._store.swap(owner, procedure_id, raw, new):
                return new if new is not None else Procedure(owner, procedure_id, "")
        raise Conflict(f"procedure {procedure_id!r} changed concurrently; retry")

    def check(self, p: Proposal) -> str:
        """The proposal's content as stored; raises ``InvalidArgument`` (empty, too long, no kind, PII)."""
        content = p.content.strip()
        if not content:
            raise InvalidArgument("content is required")
        if len(content) > MAX_CONTENT_CHARS:
            raise InvalidArgument(f"content is longer than {MAX_CONTENT_CHARS} characters")
        if p.kind is Kind.UNSPECIFIED:
            raise InvalidArgument("kind is required")
        if self._guard is not None:
            found = self._guard(f"{p.title}\n{content}\n{p.reason}")
            if found:
                raise InvalidArgument(f"content holds personal data ({', '.join(found)}); not stored")
        return content


def _decide(version: Version, state: State, by: str, note: str, now: int) -> None:
    version.state = state
    version.decided_by = by
    version.decided_at_ms = now
    version.note = note[:MAX_REASON_CHARS]


def _activate(proc: Procedure, number: int, *, by: str, note: str, now: int) -> None:
    current = proc.active
    if current is not None:
        _decide(current, State.SUPERSEDED, by, f"superseded by version {number}", now)
    _decide(proc.version(number), State.ACTIVE, by, note, now)


def _record(v: Version) -> dict[str, object]:
    return {
        "version": v.version,
        "state": v.state.name.lower(),
        "kind": v.kind.name.lower(),
        "content": v.content,
        "origin": v.origin.name.lower(),
        "proposed_by": v.proposed_by,
        "proposed_at_ms": v.proposed_at_ms,
        "reason": v.reason,
        "source_session_id": v.source_session_id,
        "source_message_ids": list(v.source_message_ids),
    }


# ---------------------------------------------------------------- the extractor
# A few-shot example proposed from a session its agent marked successful
# (``pipelines/promote.py ExtractingPromoter`` proposes it when the session is promoted). Deliberately
# simple and honest. memlane cannot tell on its own whether a session went well, so it asks the one who can:
# the agent (or an operator) sets the session's metadata ``memlane.outcome`` to ``success`` (CreateSession
# or UpdateSession). When such a session is promoted at session end, the exchange that framed the task (the
# first user request) and the answer that closed it (the last assistant turn after it) are proposed as an
# EXAMPLE procedure of the session's agent. Only session-wide turns are used (a private or group turn must
# not reach every user of the agent), text holding personal data is not proposed, and the version always
# waits for an operator's approval, whatever the agent's approval mode: it quotes one user's conversation
# and will be shown in every other user's context once approved. It records the session's user, so erasing
# that user erases the version.

OUTCOME_KEY = "memlane.outcome"
SUCCESS = "success"
EXTRACTOR_NAME = "memlane"
_TURN_CHARS = (MAX_CONTENT_CHARS - 200) // 2


def procedure_id_for(session_id: str) -> str:
    """One procedure per source session (a digest: the id grammar caps ids at 128 characters)."""
    return "example-" + hashlib.blake2b(session_id.encode(), digest_size=8).hexdigest()


def example_from(messages: list[Message]) -> tuple[str, list[str]] | None:
    """The (content, source message ids) of the example in these turns, or None."""
    shared = [m for m in messages if m.visibility == VisibilityKind.SESSION and not m.transient and m.content]
    request = next((m for m in shared if m.role == Role.USER), None)
    if request is None:
        return None
    after = shared[shared.index(request) + 1 :]
    answer = next((m for m in reversed(after) if m.role == Role.ASSISTANT), None)
    if answer is None:
        return None
    content = (
        "Example of a request handled well:\n"
        f"User: {request.content.strip()[:_TURN_CHARS]}\n"
        f"Assistant: {answer.content.strip()[:_TURN_CHARS]}"
    )
    return content, [request.message_id, answer.message_id]


def proposal_from(session: Session, messages: list[Message]) -> Proposal | None:
    """The example a session marked successful proposes to its agent, or None (not marked, or no
    framing request and closing answer among its session-wide turns)."""
    if session.metadata.get(OUTCOME_KEY, "").strip().lower() != SUCCESS:
        return None
    found = example_from(messages)
    if found is None:
        return None
    content, source_ids = found
    return Proposal(
        owner=Owner(agent_id=session.agent_id),
        procedure_id=procedure_id_for(session.session_id),
        content=content,
        kind=Kind.EXAMPLE,
        title=f"Example from a successful session ({session.channel or 'default'} channel)",
        reason="the session was marked successful (metadata memlane.outcome=success)",
        origin=Origin.EXTRACTOR,
        proposed_by=EXTRACTOR_NAME,
        source_session_id=session.session_id,
        source_message_ids=tuple(source_ids),
        source_user_id=session.user_id,
    )
