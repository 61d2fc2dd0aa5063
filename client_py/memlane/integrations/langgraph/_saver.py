"""``MemlaneSaver``: a LangGraph checkpointer whose threads are memlane sessions.

    graph = builder.compile(checkpointer=MemlaneSaver("127.0.0.1:50051", user_id="alice"))
    graph.invoke(inputs, {"configurable": {"thread_id": session_id}})

The first put of an unknown thread creates the session (``user_id`` from the config's
``configurable.user_id`` or the saver's default). Sync methods use a blocking ``memlane.Client``,
async methods a ``memlane.AsyncClient`` (one per event loop, made on first use).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from memlane import AsyncClient, Client, NotFoundError
from memlane.v1 import checkpoint_pb2 as kpb
from memlane.v1 import session_service_pb2 as spb

from . import _codec, _mirror

_PAGE = 100


class MemlaneSaver(BaseCheckpointSaver[str]):
    def __init__(
        self,
        target: str | Client | AsyncClient = "127.0.0.1:50051",
        *,
        user_id: str = "langgraph",
        agent_id: str = "",
        channel: str = "langgraph",
        token: str | None = None,
        mirror_messages: bool = True,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self._target = target if isinstance(target, str) else ""
        self._token = token
        self._agent_id = agent_id or None
        self._sync = target if isinstance(target, Client) else None
        self._async = target if isinstance(target, AsyncClient) else None
        self._async_loop: asyncio.AbstractEventLoop | None = None
        self._owned: list[Client | AsyncClient] = []
        self.user_id = user_id
        self.agent_id = agent_id
        self.channel = channel
        self.mirror_messages = mirror_messages
        self._mirrored: dict[str, set[str]] = {}  # thread -> message ids mirrored into the session

    # ------------------------------------------------------------------------------------ clients

    @property
    def client(self) -> Client:
        if self._sync is None:
            if not self._target:
                raise RuntimeError("this MemlaneSaver was given an AsyncClient: use the async methods")
            self._sync = Client(self._target, token=self._token, agent_id=self._agent_id)
            self._owned.append(self._sync)
        return self._sync

    @property
    def aclient(self) -> AsyncClient:
        loop = asyncio.get_running_loop()
        if self._async is None or (self._target and self._async_loop is not loop):
            if not self._target:
                if self._async is None:
                    raise RuntimeError("this MemlaneSaver was given a Client: use the sync methods")
                return self._async
            self._async = AsyncClient(self._target, token=self._token, agent_id=self._agent_id)
            self._async_loop = loop
            self._owned.append(self._async)
        return self._async

    def close(self) -> None:
        """Closes the blocking client this saver made (not one it was given)."""
        for c in self._owned:
            if isinstance(c, Client):
                c.close()
        self._owned = [c for c in self._owned if not isinstance(c, Client)]

    async def aclose(self) -> None:
        """Closes every client this saver made, the asyncio one included."""
        self.close()
        # Only the current loop's client can be closed from here; earlier loops' channels died with them.
        if self._async is not None and self._async in self._owned:
            await self._async.close()
        self._owned.clear()

    def _session_request(self, config: RunnableConfig, thread_id: str) -> spb.CreateSessionRequest:
        conf = config.get("configurable", {})
        return spb.CreateSessionRequest(
            session_id=thread_id,
            user_id=str(conf.get("user_id") or self.user_id),
            agent_id=self.agent_id,
            channel=self.channel,
        )

    def get_next_version(self, current: str | None, channel: None) -> str:
        # Strings that sort in version order, as LangGraph's in-memory and Postgres savers make them.
        n = 0 if current is None else int(current) if isinstance(current, int) else int(current.split(".")[0])
        return f"{n + 1:032}.{random.random():016}"

    # ------------------------------------------------------------------------------------ sync

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        resp = self.client.get_checkpoint(_codec.get_request(config))
        return _codec.to_tuple(self.serde, resp.checkpoint) if resp.found else None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        req = _codec.list_request(config, filter, before, min(limit or _PAGE, _PAGE))
        left = limit
        while left is None or left > 0:
            resp = self.client.list_checkpoints(req)
            for r in resp.checkpoints:
                if left is not None:
                    if left <= 0:
                        return
                    left -= 1
                yield _codec.to_tuple(self.serde, r)
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        req = _codec.put_request(self.serde, config, checkpoint, metadata, new_versions)
        try:
            self.client.put_checkpoint(req)
        except NotFoundError:
            self.client.create_session(self._session_request(config, req.session_id))
            self.client.put_checkpoint(req)
        if self.mirror_messages and not req.namespace and _mirror.CHANNEL in new_versions:
            self._mirror_sync(req.session_id, checkpoint)
        return _codec.stored_config(req)

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        req = _codec.writes_request(self.serde, config, writes, task_id, task_path)
        try:
            self.client.put_checkpoint_writes(req)
        except NotFoundError:  # writes may reach a new thread before its first checkpoint
            self.client.create_session(self._session_request(config, req.session_id))
            self.client.put_checkpoint_writes(req)

    def delete_thread(self, thread_id: str) -> None:
        self.client.delete_checkpoints(session_id=str(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        if run_ids:
            self.client.delete_checkpoint_runs(run_ids=[str(r) for r in run_ids])

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.client.copy_checkpoints(
            source_session_id=str(source_thread_id), target_session_id=str(target_thread_id)
        )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if thread_ids:
            self.client.prune_checkpoints(
                session_ids=[str(t) for t in thread_ids], strategy=_strategy(strategy)
            )

    def _mirror_sync(self, session_id: str, checkpoint: Checkpoint) -> None:
        known = self._mirrored.get(session_id)
        if known is None:
            known = set()
            token = ""
            while True:
                page = self.client.list_messages(session_id=session_id, page_size=1000, page_token=token)
                known |= _mirror.mirrored_ids(page)
                token = page.next_page_token
                if not token:
                    break
        p = _mirror.plan(session_id, known, checkpoint["channel_values"].get(_mirror.CHANNEL) or [])
        if p.append is not None:
            self.client.append_messages(p.append)
        if p.remove is not None:
            self.client.remove_messages(p.remove)
        self._mirrored[session_id] = p.ids

    # ------------------------------------------------------------------------------------ async

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        resp = await self.aclient.get_checkpoint(_codec.get_request(config))
        return _codec.to_tuple(self.serde, resp.checkpoint) if resp.found else None

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        req = _codec.list_request(config, filter, before, min(limit or _PAGE, _PAGE))
        left = limit
        while left is None or left > 0:
            resp = await self.aclient.list_checkpoints(req)
            for r in resp.checkpoints:
                if left is not None:
                    if left <= 0:
                        return
                    left -= 1
                yield _codec.to_tuple(self.serde, r)
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        req = _codec.put_request(self.serde, config, checkpoint, metadata, new_versions)
        c = self.aclient
        try:
            await c.put_checkpoint(req)
        except NotFoundError:
            await c.create_session(self._session_request(config, req.session_id))
            await c.put_checkpoint(req)
        if self.mirror_messages and not req.namespace and _mirror.CHANNEL in new_versions:
            await self._mirror_async(req.session_id, checkpoint)
        return _codec.stored_config(req)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        req = _codec.writes_request(self.serde, config, writes, task_id, task_path)
        c = self.aclient
        try:
            await c.put_checkpoint_writes(req)
        except NotFoundError:  # writes may reach a new thread before its first checkpoint
            await c.create_session(self._session_request(config, req.session_id))
            await c.put_checkpoint_writes(req)

    async def adelete_thread(self, thread_id: str) -> None:
        await self.aclient.delete_checkpoints(session_id=str(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        if run_ids:
            await self.aclient.delete_checkpoint_runs(run_ids=[str(r) for r in run_ids])

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.aclient.copy_checkpoints(
            source_session_id=str(source_thread_id), target_session_id=str(target_thread_id)
        )

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if thread_ids:
            await self.aclient.prune_checkpoints(
                session_ids=[str(t) for t in thread_ids], strategy=_strategy(strategy)
            )

    async def _mirror_async(self, session_id: str, checkpoint: Checkpoint) -> None:
        c = self.aclient
        known = self._mirrored.get(session_id)
        if known is None:
            known = set()
            token = ""
            while True:
                page = await c.list_messages(session_id=session_id, page_size=1000, page_token=token)
                known |= _mirror.mirrored_ids(page)
                token = page.next_page_token
                if not token:
                    break
        p = _mirror.plan(session_id, known, checkpoint["channel_values"].get(_mirror.CHANNEL) or [])
        if p.append is not None:
            await c.append_messages(p.append)
        if p.remove is not None:
            await c.remove_messages(p.remove)
        self._mirrored[session_id] = p.ids


def _strategy(name: str) -> kpb.PruneStrategy.ValueType:
    if name == "keep_latest":
        return kpb.PRUNE_STRATEGY_KEEP_LATEST
    if name == "delete":
        return kpb.PRUNE_STRATEGY_DELETE
    raise ValueError(f"unknown prune strategy {name!r}: use 'keep_latest' or 'delete'")
