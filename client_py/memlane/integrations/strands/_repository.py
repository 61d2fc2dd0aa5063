"""``MemlaneSessionRepository``: Strands' ``SessionRepository`` over memlane; ``MemlaneSessionManager``:
the ``RepositorySessionManager`` on it (what ``FileSessionManager`` is for files).

    agent = Agent(model=..., session_manager=MemlaneSessionManager("support-4417", "127.0.0.1:50051",
                                                                   user_id="alice"))

| Strands | memlane |
|---|---|
| session | a session (created for ``user_id``; its type and times in the session's metadata) |
| agent (state, conversation manager state, internal state) | a checkpoint of the session, namespace
  ``strands.agent:<agent_id>`` (JSON), replaced on each update |
| multi-agent state | a checkpoint, namespace ``strands.multi_agent:<id>`` |
| message ``<index>`` of an agent | a session message ``strands-<agent digest>-<index>`` (see ``_messages``) |
| ``update_message`` (guardrail redaction) | ``UpdateMessage``: content, native record and tool ids |
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from google.protobuf.field_mask_pb2 import FieldMask
from strands.session.repository_session_manager import RepositorySessionManager
from strands.session.session_repository import SessionRepository
from strands.types.exceptions import SessionException
from strands.types.session import Session, SessionAgent, SessionMessage, SessionType

from memlane import Client, NotFoundError
from memlane.v1 import checkpoint_pb2 as kpb

from . import _messages

if TYPE_CHECKING:
    from strands.multiagent.base import MultiAgentBase

_PAGE = 1000  # the server's largest page
_STATE_ID = "state"  # the one checkpoint of a namespace, replaced in place
_TYPE_KEY = "strands.session_type"
_CREATED_KEY = "strands.created_at"
_EDITED = FieldMask(paths=["content", "native", "tool_call_ids", "metadata"])


class MemlaneSessionRepository(SessionRepository):
    """Strands sessions, agents and messages in memlane. ``agent_id`` is memlane's caller identity (the
    author of the assistant's messages), not a Strands agent id: one repository serves every Strands
    agent of a session."""

    def __init__(
        self,
        target: str | Client = "127.0.0.1:50051",
        *,
        user_id: str = "strands",
        agent_id: str = "",
        channel: str = "strands",
        token: str | None = None,
    ) -> None:
        self.user_id = user_id
        self.agent_id = agent_id
        self.channel = channel
        self.client = (
            target if isinstance(target, Client) else Client(target, token=token, agent_id=agent_id or None)
        )
        self._owns_client = not isinstance(target, Client)

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    # ----------------------------------------------------------------------------------- sessions

    def create_session(self, session: Session, **kwargs: Any) -> Session:
        out = self.client.create_session(
            session_id=session.session_id,
            user_id=self.user_id,
            agent_id=self.agent_id,
            channel=self.channel,
            metadata={_TYPE_KEY: str(session.session_type.value), _CREATED_KEY: session.created_at},
        )
        if not out.created:
            raise SessionException(f"Session {session.session_id} already exists")
        return session

    def read_session(self, session_id: str, **kwargs: Any) -> Session | None:
        try:
            s = self.client.get_session(session_id=session_id).session
        except NotFoundError:
            return None
        created = s.metadata.get(_CREATED_KEY) or _iso(s.created_at_unix_ms)
        return Session(
            session_id=session_id,
            session_type=SessionType(s.metadata.get(_TYPE_KEY, SessionType.AGENT.value)),
            created_at=created,
            updated_at=_iso(s.last_activity_at_unix_ms) if s.last_activity_at_unix_ms else created,
        )

    # ------------------------------------------------------------------------ agents (checkpoints)

    def create_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        self._put(session_id, _agent_ns(session_agent.agent_id), session_agent.to_dict())

    def read_agent(self, session_id: str, agent_id: str, **kwargs: Any) -> SessionAgent | None:
        state = self._get(session_id, _agent_ns(agent_id))
        return None if state is None else SessionAgent.from_dict(state)

    def update_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        previous = self.read_agent(session_id, session_agent.agent_id)
        if previous is None:
            raise SessionException(f"Agent {session_agent.agent_id} in session {session_id} does not exist")
        session_agent.created_at = previous.created_at
        self._put(session_id, _agent_ns(session_agent.agent_id), session_agent.to_dict())

    def create_multi_agent(self, session_id: str, multi_agent: MultiAgentBase, **kwargs: Any) -> None:
        self._put(session_id, _multi_ns(multi_agent.id), multi_agent.serialize_state())

    def read_multi_agent(self, session_id: str, multi_agent_id: str, **kwargs: Any) -> dict[str, Any] | None:
        return self._get(session_id, _multi_ns(multi_agent_id))

    def update_multi_agent(self, session_id: str, multi_agent: MultiAgentBase, **kwargs: Any) -> None:
        if self._get(session_id, _multi_ns(multi_agent.id)) is None:
            raise SessionException(
                f"MultiAgent state {multi_agent.id} in session {session_id} does not exist"
            )
        self._put(session_id, _multi_ns(multi_agent.id), multi_agent.serialize_state())

    def _put(self, session_id: str, namespace: str, value: dict[str, Any]) -> None:
        self.client.put_checkpoint(
            session_id=session_id,
            namespace=namespace,
            checkpoint_id=_STATE_ID,
            checkpoint=kpb.TypedValue(type="json", data=json.dumps(value, ensure_ascii=False).encode()),
        )

    def _get(self, session_id: str, namespace: str) -> dict[str, Any] | None:
        out = self.client.get_checkpoint(session_id=session_id, namespace=namespace, checkpoint_id=_STATE_ID)
        if not out.found:
            return None
        value = json.loads(out.checkpoint.checkpoint.data)
        return value if isinstance(value, dict) else None

    # ------------------------------------------------------------------------------------ messages

    def create_message(
        self, session_id: str, agent_id: str, session_message: SessionMessage, **kwargs: Any
    ) -> None:
        message = _messages.to_message(session_message.to_dict(), agent_id, self.agent_id)
        self.client.append_messages(session_id=session_id, messages=[message])

    def read_message(
        self, session_id: str, agent_id: str, message_id: int, **kwargs: Any
    ) -> SessionMessage | None:
        wanted = _messages.message_id(agent_id, message_id)
        for m in self._all(session_id):
            if m.message_id == wanted and (record := _messages.record_of(m, agent_id)) is not None:
                return SessionMessage.from_dict(record)
        return None

    def update_message(
        self, session_id: str, agent_id: str, session_message: SessionMessage, **kwargs: Any
    ) -> None:
        """A redaction: the record is replaced whole (the original message stays in it, as in Strands'
        own repositories), and the text memlane summarizes, recalls and promotes becomes the redaction."""
        previous = self.read_message(session_id, agent_id, session_message.message_id)
        if previous is None:
            raise SessionException(f"Message {session_message.message_id} does not exist")
        session_message.created_at = previous.created_at
        message = _messages.to_message(session_message.to_dict(), agent_id, self.agent_id)
        self.client.update_message(session_id=session_id, message=message, update_mask=_EDITED)

    def list_messages(
        self, session_id: str, agent_id: str, limit: int | None = None, offset: int = 0, **kwargs: Any
    ) -> list[SessionMessage]:
        """The agent's records by index, from ``offset``, at most ``limit``. Turns other clients wrote
        into the session (``Memlane.add``, another framework) are not this agent's and are skipped."""
        records = [r for m in self._all(session_id) if (r := _messages.record_of(m, agent_id)) is not None]
        records.sort(key=lambda r: int(r["message_id"]))
        end = None if limit is None else offset + limit
        return [SessionMessage.from_dict(r) for r in records[offset:end]]

    def _all(self, session_id: str) -> Any:
        token = ""
        while True:
            try:
                page = self.client.list_messages(session_id=session_id, page_size=_PAGE, page_token=token)
            except NotFoundError:
                return
            yield from page.messages
            token = page.next_page_token
            if not token:
                return


class MemlaneSessionManager(RepositorySessionManager, MemlaneSessionRepository):
    """``RepositorySessionManager`` persisting to memlane: pass it as an Agent's ``session_manager``."""

    def __init__(
        self,
        session_id: str,
        target: str | Client = "127.0.0.1:50051",
        *,
        user_id: str = "strands",
        agent_id: str = "",
        channel: str = "strands",
        token: str | None = None,
        **kwargs: Any,
    ) -> None:
        MemlaneSessionRepository.__init__(
            self, target, user_id=user_id, agent_id=agent_id, channel=channel, token=token
        )
        RepositorySessionManager.__init__(self, session_id=session_id, session_repository=self, **kwargs)


def _agent_ns(agent_id: str) -> str:
    return f"strands.agent:{agent_id}"


def _multi_ns(multi_agent_id: str) -> str:
    return f"strands.multi_agent:{multi_agent_id}"


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()
