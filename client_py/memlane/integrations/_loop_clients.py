"""The asyncio client of an adapter whose framework may call it from more than one event loop (a gRPC
aio channel belongs to the loop it was made on): the one the user gave, or one made per running loop."""

from __future__ import annotations

import asyncio

from memlane import AsyncClient


class LoopClients:
    def __init__(self, target: str | AsyncClient, *, token: str | None, agent_id: str) -> None:
        self._target = target if isinstance(target, str) else ""
        self._token = token
        self._agent_id = agent_id
        self._given = target if isinstance(target, AsyncClient) else None
        self._made: dict[asyncio.AbstractEventLoop, AsyncClient] = {}

    def get(self) -> AsyncClient:
        """The one given, or one made for the running event loop."""
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        if loop not in self._made:
            self._made[loop] = AsyncClient(self._target, token=self._token, agent_id=self._agent_id or None)
        return self._made[loop]

    async def close(self) -> None:
        """Closes the client made for the running loop (never one that was given)."""
        made = self._made.pop(asyncio.get_running_loop(), None)
        if made is not None:
            await made.close()
