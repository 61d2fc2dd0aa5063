"""The model process of ``memlane serve``: the pod's one copy of the embedding model.

With worker processes, the serving process starts this child before anything asks for a vector and
embeds through it, as the workers do (``embedding/remote.py``): one model per pod, whatever the number of
processes. Being a process of its own, its bulk batches never hold the serving process's interpreter lock
and its threads set their own priorities (a query thread at the pod's, bulk threads lower: see
``embedding/onnx.py``). It imports the model's libraries and nothing else of the sidecar.

It listens on a Unix socket in a directory only this user can enter, made for this run and removed at its
end. A model process that dies is started again on the same socket; the asking processes reconnect (a
call meanwhile waits for it, up to ``RemoteEmbedder``'s limit, then fails like a call to a gone Redis).
It stops when ``memlane serve`` stops it, or by itself within a second when its parent is gone, even
after a SIGKILL.

Without worker processes (``worker_processes`` 0, thin sidecars, the test suite) the serving process
loads the model itself: there is nothing to share it with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

from . import children
from .config import ENV_PREFIX, EmbeddingSettings, Settings, build_settings, setting_fields
from .embedding.remote import EmbeddingServer
from .infra.periodic import Periodic
from .observability.logs import configure
from .wiring.embedding import load_embedder

log = logging.getLogger("memlane")

_STOP_S = 5.0  # a model process has nothing to hand back: it gets this long, then SIGKILL


class ModelProcess:
    """Started with ``start`` (returns once the model answers), restarted when it dies, ``stop``ped last."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._dir = Path(tempfile.mkdtemp(prefix="memlane-model-"))  # mode 0700: this user alone
        self.socket = str(self._dir / "model.sock")
        self._env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        self._child = children.Supervised("the model process", self._spawn)

    @property
    def pid(self) -> int | None:
        return self._child.proc.pid if self._child.alive and self._child.proc is not None else None

    async def start(self) -> None:
        await self._child.start()

    async def _spawn(self) -> subprocess.Popen[bytes]:
        values = {name: self._settings.value(name) for name in setting_fields()}
        args = [sys.executable, "-m", "memlane_server.model_process", self.socket, str(os.getpid())]
        proc = await children.spawn(args, stdin=orjson.dumps(values), env=self._env)
        log.info("started the model process", extra={"pid": proc.pid})
        return proc

    async def stop(self) -> None:
        self._child.stop_restarting()
        proc = self._child.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(children.exited(proc), _STOP_S)
            except TimeoutError:
                proc.kill()
                await children.exited(proc)
        shutil.rmtree(self._dir, ignore_errors=True)


async def _serve(settings: EmbeddingSettings, path: str, parent_pid: int) -> None:
    embedder = await load_embedder(settings)
    server = EmbeddingServer(embedder)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a dead predecessor's: this one binds the same path
    await server.listen(path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    watch = asyncio.create_task(children.parent_gone(parent_pid, stop))
    trim = Periodic("return-freed-memory", children.return_freed_memory, children.TRIM_INTERVAL_S)
    trim.start()
    try:
        await stop.wait()
    finally:
        watch.cancel()
        await trim.stop()
        await server.close()
        await embedder.close()


def main(argv: list[str]) -> int:
    path, parent_pid = argv[0], int(argv[1])
    settings = build_settings(env={}, config_file="-")  # the serving process's settings, on stdin
    configure(settings.observability.log_level, settings.observability.log_format)
    children.limit_malloc_arenas()
    asyncio.run(_serve(settings.embedding, path, parent_pid))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
