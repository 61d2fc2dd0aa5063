"""``MemlaneChatMessageHistory``: LangChain's ``BaseChatMessageHistory`` over a memlane session.

    history = MemlaneChatMessageHistory("support-4417", "127.0.0.1:50051", user_id="alice")
    chain = RunnableWithMessageHistory(runnable, lambda sid: MemlaneChatMessageHistory(sid, target))

Every LangChain message is one session message holding it whole (see ``_messages``). The session is
created on the first write for ``user_id``; a session that does not exist yet reads as empty. Sync
methods use a blocking ``memlane.Client``, async ones a ``memlane.AsyncClient`` (one per event loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage

from memlane import AsyncClient, Client, NotFoundError, new_id
from memlane.v1 import session_service_pb2 as spb

from ._messages import from_message, to_message

_PAGE = 1000  # the server's largest page


class MemlaneChatMessageHistory(BaseChatMessageHistory):
    def __init__(
        self,
        session_id: str,
        target: str | Client | AsyncClient = "127.0.0.1:50051",
        *,
        user_id: str = "langchain",
        agent_id: str = "",
        channel: str = "langchain",
        token: str | None = None,
    ) -> None:
        self.session_id = session_id
        self.user_id = user_id
        self.agent_id = agent_id
        self.channel = channel
        self._target = target if isinstance(target, str) else ""
        self._token = token
        self._sync = target if isinstance(target, Client) else None
        self._async = target if isinstance(target, AsyncClient) else None
        self._made: dict[asyncio.AbstractEventLoop, AsyncClient] = {}
        self._made_sync: Client | None = None

    # ------------------------------------------------------------------------------------ clients

    @property
    def client(self) -> Client:
        if self._sync is None:
            if not self._target:
                raise RuntimeError("this history was given an AsyncClient: use the async methods")
            self._sync = self._made_sync = Client(
                self._target, token=self._token, agent_id=self.agent_id or None
            )
        return self._sync

    @property
    def aclient(self) -> AsyncClient:
        if self._async is not None:
            return self._async
        if not self._target:
            raise RuntimeError("this history was given a Client: use the sync methods")
        loop = asyncio.get_running_loop()
        if loop not in self._made:
            self._made[loop] = AsyncClient(self._target, token=self._token, agent_id=self.agent_id or None)
        return self._made[loop]

    def close(self) -> None:
        """Closes the blocking client this history made (not one it was given)."""
        if self._made_sync is not None:
            self._made_sync.close()
            self._sync = self._made_sync = None

    async def aclose(self) -> None:
        """Closes the clients this history made, the running loop's asyncio one included."""
        self.close()
        made = self._made.pop(asyncio.get_running_loop(), None)
        if made is not None:
            await made.close()

    # ------------------------------------------------------------------------------------ requests

    def _create(self) -> spb.CreateSessionRequest:
        return spb.CreateSessionRequest(
            session_id=self.session_id, user_id=self.user_id, agent_id=self.agent_id, channel=self.channel
        )

    def _append(self, messages: Sequence[BaseMessage]) -> spb.AppendMessagesRequest:
        batch = [to_message(m) for m in messages]
        request = spb.AppendMessagesRequest(session_id=self.session_id, messages=batch)
        for m in request.messages:  # ids now, so the append after a create lands each message once
            m.message_id = m.message_id or new_id()
        return request

    def _page(self, token: str) -> spb.ListMessagesRequest:
        return spb.ListMessagesRequest(session_id=self.session_id, page_size=_PAGE, page_token=token)

    # ------------------------------------------------------------------------------------ sync

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        out: list[BaseMessage] = []
        token = ""
        try:
            while True:
                page = self.client.list_messages(self._page(token))
                out.extend(from_message(m) for m in page.messages)
                token = page.next_page_token
                if not token:
                    return out
        except NotFoundError:
            return []

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        if not messages:
            return
        request = self._append(messages)
        try:
            self.client.append_messages(request)
        except NotFoundError:  # the first write, or the session was erased / retired since
            self.client.create_session(self._create())
            self.client.append_messages(request)

    def clear(self) -> None:
        try:
            self.client.remove_messages(session_id=self.session_id, all=True)
        except NotFoundError:
            return

    # ------------------------------------------------------------------------------------ async

    async def aget_messages(self) -> list[BaseMessage]:
        out: list[BaseMessage] = []
        token = ""
        try:
            while True:
                page = await self.aclient.list_messages(self._page(token))
                out.extend(from_message(m) for m in page.messages)
                token = page.next_page_token
                if not token:
                    return out
        except NotFoundError:
            return []

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if not messages:
            return
        request = self._append(messages)
        try:
            await self.aclient.append_messages(request)
        except NotFoundError:
            await self.aclient.create_session(self._create())
            await self.aclient.append_messages(request)

    async def aclear(self) -> None:
        try:
            await self.aclient.remove_messages(session_id=self.session_id, all=True)
        except NotFoundError:
            return
