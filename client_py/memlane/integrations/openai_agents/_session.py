"""``MemlaneSession``: the OpenAI Agents SDK's ``Session`` protocol over a memlane session.

    session = MemlaneSession("support-4417", "127.0.0.1:50051", user_id="alice")
    result = await Runner.run(agent, "My order arrived damaged.", session=session)

Each item is one session message holding the item whole (see ``_items``). The session is created on
the first ``add_items`` (for ``user_id``); reading or clearing a session that does not exist yet gives
the empty history, as the SDK's SQLite session does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memlane import AsyncClient, NotFoundError
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import session_pb2 as pb
from memlane.v1 import session_service_pb2 as spb

from .._loop_clients import LoopClients
from . import _items

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings

_PAGE = 1000  # the server's largest page


class MemlaneSession:
    """One conversation (``session_id``) of one user; ``agent_id`` is sent as the caller's identity and
    recorded as the author of the assistant's items."""

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        target: str | AsyncClient = "127.0.0.1:50051",
        *,
        user_id: str = "openai-agents",
        agent_id: str = "",
        channel: str = "openai-agents",
        token: str | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.session_id = session_id
        self.user_id = user_id
        self.agent_id = agent_id
        self.channel = channel
        self.session_settings = session_settings
        self._clients = LoopClients(target, token=token, agent_id=agent_id)
        self._created = False

    @property
    def client(self) -> AsyncClient:
        """The asyncio client: the one given, or one made for the running event loop."""
        return self._clients.get()

    async def close(self) -> None:
        """Closes the client this session made for the running loop (not one it was given)."""
        await self._clients.close()

    # ---------------------------------------------------------------------------- Session protocol

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history oldest first; with ``limit``, its latest ``limit`` items (0: none; negative: all,
        as the SDK's SQLite session)."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit == 0:
            return []
        newest_first = limit is not None and limit > 0
        items: list[Any] = []
        token = ""
        try:
            while True:
                page = await self.client.list_messages(
                    session_id=self.session_id,
                    order=spb.MESSAGE_ORDER_NEWEST_FIRST if newest_first else spb.MESSAGE_ORDER_OLDEST_FIRST,
                    page_size=min(limit, _PAGE) if newest_first and limit else _PAGE,
                    page_token=token,
                )
                items.extend(i for m in page.messages if (i := _items.to_item(m)) is not None)
                token = page.next_page_token
                if not token or (newest_first and limit and len(items) >= limit):
                    break
        except NotFoundError:
            return []
        if newest_first:
            return list(reversed(items[:limit]))
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if not items:
            return
        request = spb.AppendMessagesRequest(
            session_id=self.session_id,
            messages=[_items.to_message(dict(i), self.agent_id) for i in items],
        )
        if not self._created:
            await self._create()
        try:
            await self.client.append_messages(request)
        except NotFoundError:  # erased or retired since: the same ids land once when sent again
            await self._create()
            await self.client.append_messages(request)

    async def pop_item(self) -> TResponseInputItem | None:
        """Removes the latest message and returns its item (None when the session is empty)."""
        while True:
            try:
                removed = await self.client.remove_messages(session_id=self.session_id, last=1)
            except NotFoundError:
                return None
            if not removed.removed:
                return None
            item = _items.to_item(removed.removed[-1])
            if item is not None:
                return item  # type: ignore[return-value]
            # A message with no item form (another framework's tool traffic): gone too, as the SDK's
            # SQLite session drops rows it cannot decode; keep looking.

    async def clear_session(self) -> None:
        try:
            await self.client.remove_messages(session_id=self.session_id, all=True)
        except NotFoundError:
            return

    # ---------------------------------------------------------------------------- memlane extras

    async def _create(self) -> None:
        await self.client.create_session(
            session_id=self.session_id, user_id=self.user_id, agent_id=self.agent_id, channel=self.channel
        )
        self._created = True

    async def last_user_text(self) -> str:
        """The text of the latest user turn (the recall query for the next model call)."""
        try:
            page = await self.client.list_messages(
                session_id=self.session_id,
                order=spb.MESSAGE_ORDER_NEWEST_FIRST,
                roles=[pb.ROLE_USER],
                page_size=1,
            )
        except NotFoundError:
            return ""
        return page.messages[0].content if page.messages else ""

    async def assemble(self, user_input: str, **options: Any) -> list[cpb.ContextBlock]:
        """The blocks memlane assembles for the next model call (``options``: AssembleContextRequest
        fields such as ``model`` or ``memory_limit``)."""
        try:
            stream = self.client.assemble_context(
                session_id=self.session_id, user_input=user_input, **options
            )
            return [b async for r in stream for b in r.blocks]
        except NotFoundError:
            return []
