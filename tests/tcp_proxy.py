"""A TCP forwarder we control: makes a server (PostgreSQL) unreachable and reachable again without
touching the server itself. ``pause()`` closes the listening socket and cuts every open connection;
``resume()`` listens again on the same port."""

from __future__ import annotations

import asyncio
import socket
import threading


class TCPProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.resume()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        self._writers.update((cw, uw))
        await asyncio.gather(self._pipe(cr, uw), self._pipe(ur, cw))
        self._writers.discard(cw)
        self._writers.discard(uw)

    def _call(self, coro):  # noqa: ANN001
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def resume(self) -> None:
        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

        self._call(start())

    def pause(self) -> None:
        async def stop() -> None:
            server, self._server = self._server, None
            if server is not None:
                server.close()  # stop accepting
            for w in list(self._writers):
                w.transport.abort()  # cut open connections
            self._writers.clear()
            if server is not None:
                await server.wait_closed()

        self._call(stop())

    def close(self) -> None:
        self.pause()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
