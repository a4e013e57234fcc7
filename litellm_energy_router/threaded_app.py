"""An aiohttp application served on 127.0.0.1 (a free port) by its own event loop on a daemon thread,
for synchronous callers: the local OpenAI-compatible backend (``demo/backend.py``) and the test servers::

    with ThreadedApp(make_app, name="replay backend") as srv:
        httpx.get(f"{srv.url}/v1/models")
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

from aiohttp import web


class ThreadedApp:
    """Serve ``app_factory()`` (a zero-argument callable returning a :class:`web.Application`, called on
    the server's thread) until :meth:`stop`.

    Args:
        app_factory: builds the application.
        name: what :meth:`start`'s error calls the server, and the thread's name.
        backlog: listen backlog, connections.
        start_timeout_s: seconds :meth:`start` waits for the socket to listen.
        port: TCP port on 127.0.0.1 (0: a free one).
    """

    def __init__(
        self,
        app_factory: Callable[[], web.Application],
        *,
        name: str = "aiohttp app",
        backlog: int = 128,
        start_timeout_s: float = 30.0,
        port: int = 0,
    ) -> None:
        self.app_factory = app_factory
        self.want_port = port
        self.name = name
        self.backlog = backlog
        self.start_timeout_s = start_timeout_s
        self.port: int | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if self.port is None:
            raise RuntimeError(f"{self.name} not started")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ThreadedApp":
        """Listen and serve on the thread; raises :class:`RuntimeError` naming the cause when it cannot."""
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = self.loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                self._runner = web.AppRunner(self.app_factory(), access_log=None)
                loop.run_until_complete(self._runner.setup())
                site = web.TCPSite(self._runner, "127.0.0.1", self.want_port, backlog=self.backlog)
                loop.run_until_complete(site.start())
                self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            except BaseException as e:  # noqa: BLE001 - reported to the caller of start()
                failure.append(e)
                loop.close()
                return
            finally:
                ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
        self._thread.start()
        if not ready.wait(self.start_timeout_s) or failure:
            raise RuntimeError(f"{self.name} did not start: {failure[0] if failure else 'timeout'}")
        return self

    def stop(self) -> None:
        """Close the server (waits up to 10 s for running handlers) and end the thread."""
        loop, self.loop = self.loop, None
        if loop is None or not loop.is_running():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(10)  # type: ignore[union-attr]
        except TimeoutError:
            pass  # a handler still running: the loop stops anyway
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> "ThreadedApp":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
