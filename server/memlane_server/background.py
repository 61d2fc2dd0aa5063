"""Run a sidecar on its own event loop in a background thread.

For programs that embed memlane in-process (the eval and bench commands, notebooks, the test suite):
the sidecar is the real one, served over real sockets, and callers talk to it through the real client.
"""

from __future__ import annotations

import asyncio
import io
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future

from .app import Sidecar
from .config import Settings
from .context import MemorySource


class SidecarThread:
    def __init__(
        self,
        settings: Settings,
        *,
        memory: MemorySource | None = None,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
    ) -> None:
        self.settings = settings
        self.sidecar = Sidecar(settings, memory=memory)
        # ``memlane serve`` runs on uvloop when installed; a test passes uvloop.new_event_loop to match.
        self._loop = loop_factory()
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

    def stop(self, timeout: float = 60.0) -> None:
        if not self._thread.is_alive():
            return
        stopping = asyncio.run_coroutine_threadsafe(self.sidecar.stop(), self._loop)
        try:
            stopping.result(timeout)
        except TimeoutError:
            # A stop that hangs is a bug to find, not to wait out: say where the loop is.
            raise TimeoutError(f"the sidecar did not stop within {timeout} s\n{self._where()}") from None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def _where(self) -> str:
        """The loop thread's stack (blocked in a call, or idle in select) and every pending task's."""
        out = io.StringIO()
        frame = sys._current_frames().get(self._thread.ident or -1)
        out.write("loop thread:\n" + "".join(traceback.format_stack(frame)) if frame else "no loop thread\n")
        for task in list(asyncio.all_tasks(self._loop)):
            out.write(f"\n{task!r}\n")
            task.print_stack(limit=20, file=out)
        return out.getvalue()

    def __enter__(self) -> SidecarThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
