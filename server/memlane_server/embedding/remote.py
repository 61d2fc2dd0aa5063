"""The embedding model over a local socket: one model per pod, in a process of its own.

``memlane serve`` with worker processes runs the model in one more child, the model process
(``children.py``): the serving process asks it for query vectors, the workers for their bulk
batches, and neither loads a model. The model process's ``OnnxEmbedder`` keeps the two apart (a query
thread, bulk threads at lower priority: ``onnx.py``); being a process of its own, no bulk batch holds the
serving process's interpreter lock or a core it needs.

``EmbeddingServer`` answers on a Unix socket in a directory only this user can enter; ``RemoteEmbedder``
is the ``Embedder`` of the processes that ask, reconnecting once when the model process was restarted.

Frames, both ways: a header (payload length, request id, kind) and the payload. A request's payload is
a JSON array of texts, its kind how to run them (``QUERY``: by size, as a local call; ``BULK``: always in
the bulk lane; ``FORGET``: drop the query cache, no answer). An answer's payload is the vectors (float32,
row-major) or, for an error, its message. The first frame of a connection (request id 0, ``HELLO``)
carries the model's dimension and sequence length as JSON; while a connection has requests in flight the
model process sends an ``ALIVE`` frame (request id 0, empty) every ``alive_s``.

Every call has its own timeout, of silence rather than of length: it fails with ``EmbeddingUnavailable``
(UNAVAILABLE with a retry hint) once the model process has sent nothing on its connection for
``silence_s`` (``embedding_call_timeout_seconds``), so a stopped or wedged model process costs a caller a
second or two, never its whole deadline, while a long bulk batch of a live one runs to its end. The model
process's supervisor kills a silent one and starts it again (``supervision.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct

import numpy as np
import numpy.typing as npt
import orjson

from ..errors import Unavailable
from ..observability import spans
from .onnx import OnnxEmbedder, runs_as_query

log = logging.getLogger("memlane")

_HEADER = struct.Struct("<IQB")  # payload bytes, request id, kind
QUERY, BULK, FORGET = 1, 2, 3  # request kinds
_OK, _ERROR, _HELLO, _ALIVE = 0, 1, 2, 3  # answer kinds
_CLOSE_S = 2.0  # how long closing waits for the connections' readers to end
# A frame larger than this is a broken peer, not a batch (a session end's largest is a few MB).
MAX_FRAME_BYTES = 256 * 1024 * 1024


# A caller may retry this soon: a stalled model process is killed and started again within seconds.
RETRY_AFTER_MS = 1000
# How long the first connection waits for a model process that is still loading its model.
START_WAIT_S = 30.0


class EmbeddingUnavailable(Unavailable, ConnectionError):
    """The model process is gone (and did not come back in time), silent, or answered an error."""

    reason = "EMBEDDING_UNAVAILABLE"

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after_ms=RETRY_AFTER_MS)


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    size, request_id, kind = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if size > MAX_FRAME_BYTES:
        raise EmbeddingUnavailable(f"an embedding frame of {size} bytes (at most {MAX_FRAME_BYTES})")
    return request_id, kind, await reader.readexactly(size)


def _frame(request_id: int, kind: int, payload: bytes) -> bytes:
    return _HEADER.pack(len(payload), request_id, kind) + payload


class EmbeddingServer:
    """The model process's end: answers each connection's requests with ``embedder``."""

    def __init__(self, embedder: OnnxEmbedder, *, alive_s: float) -> None:
        self._embedder = embedder
        self._alive_s = alive_s  # how often a connection with requests in flight hears ALIVE
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def listen(self, path: str) -> None:
        self._server = await asyncio.start_unix_server(self._accept, path=path)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._writers.add(writer)
        calls: set[asyncio.Task[None]] = set()
        alive = asyncio.create_task(self._keep_telling(writer, calls))
        try:
            hello = {"ndims": self._embedder.ndims, "max_length": self._embedder.max_length}
            writer.write(_frame(0, _HELLO, orjson.dumps(hello)))
            while True:
                try:
                    request_id, kind, payload = await _read_frame(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the asking process exited: its requests in flight have no one to answer
                if kind == FORGET:
                    self._embedder.forget_cached()
                    continue
                call = asyncio.create_task(self._answer(writer, request_id, kind, payload))
                calls.add(call)
                call.add_done_callback(calls.discard)
        finally:
            alive.cancel()
            for call in calls:
                call.cancel()
            writer.close()
            self._writers.discard(writer)
            self._connections.discard(task)

    async def _keep_telling(self, writer: asyncio.StreamWriter, calls: set[asyncio.Task[None]]) -> None:
        """ALIVE while requests are in flight: the asking side tells a slow batch from a silent process."""
        while True:
            await asyncio.sleep(self._alive_s)
            if calls and not writer.is_closing():
                writer.write(_frame(0, _ALIVE, b""))

    async def _answer(self, writer: asyncio.StreamWriter, request_id: int, kind: int, payload: bytes) -> None:
        try:
            texts = orjson.loads(payload)
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise ValueError("an embedding request must be a list of texts")
            vectors = await self._embedder.embed(texts, bulk=True if kind == BULK else None)
            reply = _frame(request_id, _OK, np.ascontiguousarray(vectors, dtype="<f4").tobytes())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the asking call fails with it, as it would with a local model
            log.warning("an embedding request failed", extra={"error": str(exc)})
            reply = _frame(request_id, _ERROR, str(exc).encode())
        with contextlib.suppress(ConnectionError):
            writer.write(reply)  # one write per frame: answers of concurrent requests never interleave
            await writer.drain()

    async def close(self) -> None:
        """Closes every connection (each one's reader then ends on its own: a connection's task is not
        cancelled, which asyncio's stream server would log as an error)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=_CLOSE_S)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.pending: dict[int, asyncio.Future[npt.NDArray[np.float32]]] = {}
        self.receiver: asyncio.Task[None] | None = None
        self.lost = False
        self.heard_at = asyncio.get_running_loop().time()  # the last frame from the model process


class RemoteEmbedder:
    """The ``Embedder`` of a process without a model: the model process's, over its socket. ``bulk``:
    every call runs in the bulk lane (a worker's); else a call runs as it would locally (by its size).
    ``silence_s``: a call fails once the model process has sent nothing for this long; ``reconnect_s``:
    how long a call waits for a restarted model process to answer again."""

    def __init__(self, path: str, *, bulk: bool, silence_s: float, reconnect_s: float) -> None:
        self._path = path
        self._kind = BULK if bulk else QUERY
        self._silence_s = silence_s
        self._reconnect_s = reconnect_s
        self._ids = itertools.count(1)
        self._conn: _Connection | None = None
        self._connecting: asyncio.Lock | None = None
        self._ndims = 0
        self._max_length = 0
        # Texts asked for by lane (the memlane_embedding_texts metric of this process; the model process
        # runs them, and a worker's count reaches /metrics through the serving process's merge).
        self._texts = {"query": 0, "bulk": 0}

    @classmethod
    async def connect(cls, path: str, *, bulk: bool, silence_s: float, reconnect_s: float) -> RemoteEmbedder:
        """Once the model process answers (it may still be loading its model: ``START_WAIT_S``)."""
        remote = cls(path, bulk=bulk, silence_s=silence_s, reconnect_s=reconnect_s)
        await remote._connection(START_WAIT_S)
        return remote

    @property
    def ndims(self) -> int:
        return self._ndims

    @property
    def max_length(self) -> int:
        return self._max_length

    def texts_by_lane(self) -> dict[str, int]:
        return dict(self._texts)

    async def _connection(self, wait_s: float) -> _Connection:
        """The open connection, or a new one (the model process may be restarting: retried for ``wait_s``,
        a stopped one included: its socket accepts, but it never says hello)."""
        if self._conn is not None and not self._conn.lost:
            return self._conn
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        try:
            async with asyncio.timeout(wait_s), self._connecting:
                if self._conn is not None and not self._conn.lost:
                    return self._conn
                return await self._connect()
        except TimeoutError:
            raise EmbeddingUnavailable(
                f"the model process does not answer (waited {wait_s:g} s); retry shortly"
            ) from None

    async def _connect(self) -> _Connection:
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self._path)
            except OSError:  # not listening (yet): it is being started again
                await asyncio.sleep(0.1)
                continue
            try:
                _, kind, payload = await _read_frame(reader)
            except (OSError, asyncio.IncompleteReadError):
                writer.close()
                await asyncio.sleep(0.1)
                continue
            except BaseException:
                writer.close()  # the wait ran out on a process that accepts but never says hello
                raise
            if kind != _HELLO:
                writer.close()
                raise EmbeddingUnavailable("the model process did not say hello")
            break
        hello = orjson.loads(payload)
        self._ndims, self._max_length = int(hello["ndims"]), int(hello["max_length"])
        conn = _Connection(reader, writer)
        conn.receiver = asyncio.create_task(self._receive(conn), name="memlane-remote-embedder")
        self._conn = conn
        return conn

    async def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        # The caller's side of the hop: the frames carry no trace context (the model process sends none).
        with spans.embedding_span("", len(texts), remote=True):
            return await self._embed(texts)

    async def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self._ndims), dtype=np.float32)
        conn = await self._connection(self._reconnect_s)
        request_id = next(self._ids)
        future: asyncio.Future[npt.NDArray[np.float32]] = asyncio.get_running_loop().create_future()
        conn.pending[request_id] = future
        query = runs_as_query(len(texts), None if self._kind == QUERY else True)
        self._texts["query" if query else "bulk"] += len(texts)
        try:
            try:
                async with asyncio.timeout(self._silence_s):
                    conn.writer.write(_frame(request_id, self._kind, orjson.dumps(texts)))
                    await conn.writer.drain()
            except TimeoutError:
                raise EmbeddingUnavailable(self._silent) from None
            except RuntimeError as exc:
                # uvloop refuses a write on a transport closed under it ("the handler is closed"): the
                # model process died between the connection's last read and this write (chaos: a kill -9
                # under recall answered INTERNAL).
                conn.lost = True
                raise EmbeddingUnavailable("the model process closed its socket") from exc
            return await self._answer(conn, future)
        except EmbeddingUnavailable:
            raise
        except ConnectionError as exc:
            conn.lost = True
            raise EmbeddingUnavailable("the model process closed its socket") from exc
        finally:
            conn.pending.pop(request_id, None)

    @property
    def _silent(self) -> str:
        return f"the model process sent nothing for {self._silence_s:g} s (stalled?); retry shortly"

    async def _answer(
        self, conn: _Connection, future: asyncio.Future[npt.NDArray[np.float32]]
    ) -> npt.NDArray[np.float32]:
        """The call's answer, as long as the model process is heard from (an answer or ALIVE) within
        ``silence_s``: a batch of any length, but no wait on a silent process."""
        loop = asyncio.get_running_loop()
        heard = loop.time()  # the request went out just now
        while True:
            await asyncio.wait([future], timeout=self._silence_s / 4)
            if future.done():
                return future.result()
            heard = max(heard, conn.heard_at)
            if loop.time() - heard > self._silence_s:
                raise EmbeddingUnavailable(self._silent)

    async def _receive(self, conn: _Connection) -> None:
        try:
            while True:
                request_id, kind, payload = await _read_frame(conn.reader)
                conn.heard_at = asyncio.get_running_loop().time()
                future = conn.pending.get(request_id)
                if future is None or future.done():
                    continue  # its caller was cancelled
                if kind == _OK:
                    rows = np.frombuffer(payload, dtype="<f4").reshape(-1, self._ndims)
                    future.set_result(rows.astype(np.float32))
                else:
                    future.set_exception(EmbeddingUnavailable(payload.decode(errors="replace")))
        except (asyncio.IncompleteReadError, ConnectionError, EmbeddingUnavailable) as exc:
            conn.lost = True
            lost = EmbeddingUnavailable(f"the model process closed its socket: {exc}")
            for future in conn.pending.values():
                if not future.done():
                    future.set_exception(lost)

    def forget_cached(self) -> None:
        """Erasure: the model process drops its query cache (queries hold users' words)."""
        conn = self._conn
        if conn is not None and not conn.lost:
            with contextlib.suppress(ConnectionError, RuntimeError):
                conn.writer.write(_frame(0, FORGET, b""))

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.receiver is not None:
            conn.receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await conn.receiver
        conn.writer.close()
