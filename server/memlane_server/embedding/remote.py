"""One embedding model per pod: worker processes embed through the serving process's model.

``memlane serve`` loads the model once (the serving process needs it for query vectors anyway, also as a
thin sidecar without workers) and hands each worker process one end of a socket pair at spawn. The worker
embeds with ``RemoteEmbedder`` over it; ``EmbeddingServer`` answers on the other end with the serving
process's ``OnnxEmbedder``, always in its bulk lane (lower CPU priority, apart from query vectors: see
``onnx.py``). A socket pair has no address: nothing else on the machine can reach the model through it.

Frames, both ways: a header (payload length, request id, kind) and the payload. A request's payload is
a JSON array of texts; an answer's is the vectors (float32, row-major) or, for an error, its message.
The first frame the server sends (request id 0) carries the model's dimension as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import struct

import numpy as np
import numpy.typing as npt
import orjson

from .onnx import OnnxEmbedder

log = logging.getLogger("memlane")

_HEADER = struct.Struct("<IQB")  # payload bytes, request id, kind
_OK, _ERROR, _HELLO = 0, 1, 2
# A frame larger than this is a broken peer, not a batch (a session end's largest is a few MB).
MAX_FRAME_BYTES = 256 * 1024 * 1024


class EmbeddingUnavailable(ConnectionError):
    """The process that owns the model is gone (the worker stops with it) or answered an error."""


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    size, request_id, kind = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if size > MAX_FRAME_BYTES:
        raise EmbeddingUnavailable(f"an embedding frame of {size} bytes (at most {MAX_FRAME_BYTES})")
    return request_id, kind, await reader.readexactly(size)


def _frame(request_id: int, kind: int, payload: bytes) -> bytes:
    return _HEADER.pack(len(payload), request_id, kind) + payload


class EmbeddingServer:
    """The serving process's end: answers each worker's requests with ``embedder``'s bulk lane."""

    def __init__(self, embedder: OnnxEmbedder) -> None:
        self._embedder = embedder
        self._connections: set[asyncio.Task[None]] = set()

    def serve(self, sock: socket.socket) -> None:
        """Answer requests on ``sock`` (this process's end of a worker's pair) until the worker is gone."""
        task = asyncio.create_task(self._serve(sock), name="memlane-embedding-server")
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_connection(sock=sock)
        calls: set[asyncio.Task[None]] = set()
        try:
            writer.write(_frame(0, _HELLO, orjson.dumps({"ndims": self._embedder.ndims})))
            while True:
                try:
                    request_id, _, payload = await _read_frame(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the worker exited: its requests in flight have no one to answer
                call = asyncio.create_task(self._answer(writer, request_id, payload))
                calls.add(call)
                call.add_done_callback(calls.discard)
        finally:
            for call in calls:
                call.cancel()
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, request_id: int, payload: bytes) -> None:
        try:
            texts = orjson.loads(payload)
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise ValueError("an embedding request must be a list of texts")
            vectors = await self._embedder.embed(texts, bulk=True)
            reply = _frame(request_id, _OK, np.ascontiguousarray(vectors, dtype="<f4").tobytes())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the worker's job fails with it and is retried, as for a local model
            log.warning("an embedding request of a worker process failed", extra={"error": str(exc)})
            reply = _frame(request_id, _ERROR, str(exc).encode())
        with contextlib.suppress(ConnectionError):
            writer.write(reply)  # one write per frame: answers of concurrent requests never interleave
            await writer.drain()

    async def close(self) -> None:
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task


class RemoteEmbedder:
    """A worker process's ``Embedder``: the serving process's model over the socket pair it was given."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ndims: int) -> None:
        self._reader, self._writer, self._ndims = reader, writer, ndims
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[npt.NDArray[np.float32]]] = {}
        self._receiver = asyncio.create_task(self._receive(), name="memlane-remote-embedder")
        self._lost: EmbeddingUnavailable | None = None

    @classmethod
    async def connect(cls, fd: int) -> RemoteEmbedder:
        """Over the inherited descriptor ``fd``; reads the model's dimension first."""
        sock = socket.socket(fileno=fd)
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            request_id, kind, payload = await _read_frame(reader)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            writer.close()
            raise EmbeddingUnavailable("the serving process closed the embedding socket") from exc
        if request_id != 0 or kind != _HELLO:
            writer.close()
            raise EmbeddingUnavailable("the embedding socket did not start with the model's dimension")
        return cls(reader, writer, int(orjson.loads(payload)["ndims"]))

    @property
    def ndims(self) -> int:
        return self._ndims

    async def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self._ndims), dtype=np.float32)
        if self._lost is not None:
            raise self._lost
        request_id = next(self._ids)
        future: asyncio.Future[npt.NDArray[np.float32]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self._writer.write(_frame(request_id, _OK, orjson.dumps(texts)))
            await self._writer.drain()
            return await future
        except ConnectionError as exc:
            raise EmbeddingUnavailable("the serving process closed the embedding socket") from exc
        finally:
            self._pending.pop(request_id, None)

    async def _receive(self) -> None:
        try:
            while True:
                request_id, kind, payload = await _read_frame(self._reader)
                future = self._pending.get(request_id)
                if future is None or future.done():
                    continue  # its caller was cancelled
                if kind == _OK:
                    rows = np.frombuffer(payload, dtype="<f4").reshape(-1, self._ndims)
                    future.set_result(rows.astype(np.float32))
                else:
                    future.set_exception(EmbeddingUnavailable(payload.decode(errors="replace")))
        except (asyncio.IncompleteReadError, ConnectionError, EmbeddingUnavailable) as exc:
            self._lost = EmbeddingUnavailable(f"the serving process's embedding socket closed: {exc}")
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(self._lost)

    def forget_cached(self) -> None:
        """Nothing is cached here: the serving process's query cache is the only one."""

    async def close(self) -> None:
        self._receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._receiver
        self._writer.close()
