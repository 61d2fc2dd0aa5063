"""``MemlaneAgentThread``: a Semantic Kernel agent thread (``ChatHistoryAgentThread``, what
``ChatCompletionAgent`` takes) whose chat history lives in a memlane session.

    thread = MemlaneAgentThread("support-4417", "127.0.0.1:50051", user_id="alice", agent_id="support")
    response = await agent.get_response(messages="My order 4417 arrived damaged.", thread=thread)

The thread id is the session id. Every message the agent sees or says (user turns, function calls and
results, replies) is appended to the session as it arrives; ``get_messages`` reads the session, so a
thread made in a fresh process (same session id) resumes the conversation. ``delete`` removes the
session's messages (``RemoveMessages(all)``); the session stays (its summary, and what was promoted).
"""

from __future__ import annotations

from collections.abc import AsyncIterable

from semantic_kernel.agents import ChatHistoryAgentThread
from semantic_kernel.contents import ChatHistory, ChatMessageContent
from semantic_kernel.contents.utils.author_role import AuthorRole

from memlane import AsyncClient, NotFoundError

from .._loop_clients import LoopClients
from . import _messages

_PAGE = 1000  # the server's largest page


class MemlaneAgentThread(ChatHistoryAgentThread):
    def __init__(
        self,
        session_id: str,
        target: str | AsyncClient = "127.0.0.1:50051",
        *,
        user_id: str = "semantic-kernel",
        agent_id: str = "",
        channel: str = "semantic-kernel",
        token: str | None = None,
        chat_history: ChatHistory | None = None,
    ) -> None:
        """``chat_history``: the local working copy (a ``ChatHistoryReducer`` makes ``reduce`` work on
        it); it is reloaded from the session by ``get_messages``."""
        super().__init__(chat_history=chat_history, thread_id=session_id)
        self.user_id = user_id
        self.agent_id = agent_id
        self.channel = channel
        self._clients = LoopClients(target, token=token, agent_id=agent_id)
        self._created = False

    @property
    def client(self) -> AsyncClient:
        """The asyncio client: the one given, or one made for the running event loop."""
        return self._clients.get()

    async def close(self) -> None:
        """Closes the client this thread made for the running loop (not one it was given)."""
        await self._clients.close()

    async def _ensure_session(self) -> None:
        if not self._created:
            await self.client.create_session(
                session_id=self._id, user_id=self.user_id, agent_id=self.agent_id, channel=self.channel
            )
            self._created = True

    async def _delete(self) -> None:
        self._chat_history.clear()
        try:
            await self.client.remove_messages(session_id=self._id, all=True)
        except NotFoundError:
            return

    async def _on_new_message(self, new_message: str | ChatMessageContent) -> None:
        if isinstance(new_message, str):
            new_message = ChatMessageContent(role=AuthorRole.USER, content=new_message)
        # The reference thread's rule: a message that names this thread as its origin is already in it.
        if new_message.metadata and new_message.metadata.get("thread_id") == self._id:
            return
        await self._ensure_session()
        await self.client.append_messages(
            session_id=self._id, messages=[_messages.to_message(new_message, self.agent_id)]
        )
        self._chat_history.add_message(new_message)

    async def get_messages(self) -> AsyncIterable[ChatMessageContent]:
        """The session's messages oldest first (the local working copy is replaced by them)."""
        if self._id is None:
            await self.create()
        loaded: list[ChatMessageContent] = []
        token = ""
        while True:
            try:
                page = await self.client.list_messages(session_id=self._id, page_size=_PAGE, page_token=token)
            except NotFoundError:
                break
            loaded.extend(c for m in page.messages if (c := _messages.to_content(m)) is not None)
            token = page.next_page_token
            if not token:
                break
        self._chat_history.messages = loaded
        for message in loaded:
            yield message
