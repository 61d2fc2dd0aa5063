"""Run a sidecar on its own event loop in a background thread.

For programs that embed memlane in-process (the eval and bench commands, notebooks, the test suite):
the sidecar is the real one, served over real sockets, and callers talk to it through the real client.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

from .app import Sidecar
from .config import Settings
from .context import MemorySource


class SidecarThread:
    def __init__(self, settings: Settings, *, memory: MemorySource | None = None) -> None:
        self.settings = settings
        self.sidecar = Sidecar(settings, memory=memory)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="memlane-sidecar", daemon=True)
        self._started: Future[None] = Future()

    @property
    def target(self) -> str:
        """The first gRPC address, in the form a client accepts."""
        return self.sidecar.addresses[0]

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.sidecar.start())
        except BaseException as exc:
            self._started.set_exception(exc)
            self._loop.run_until_complete(self.sidecar.stop())
            return
        self._started.set_result(None)
        self._loop.run_forever()

    def start(self, timeout: float = 60.0) -> SidecarThread:
        self._thread.start()
        self._started.result(timeout)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.sidecar.stop(), self._loop).result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def __enter__(self) -> SidecarThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
