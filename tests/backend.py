"""A real OpenAI-compatible HTTP server on 127.0.0.1 for tests: /<name>/v1/chat/completions,
/<name>/v1/completions and /<name>/v1/embeddings for any backend <name>. It records what each
backend received, so tests assert on real traffic."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import defaultdict

from aiohttp import web


class Backend:
    def __init__(self, delay_s: float = 0.0, reply=None):
        self.delay_s = delay_s
        self.reply = reply or (lambda name, body: f"answer from {name}")
        self.received: dict[str, list[dict]] = defaultdict(list)
        self._lock = threading.Lock()
        self.port = None
        self._loop = None
        self._runner = None

    def count(self, name: str) -> int:
        with self._lock:
            return len(self.received[name])

    def base(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}/v1"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        name, kind = request.match_info["name"], request.match_info["kind"]
        body = await request.json()
        with self._lock:
            self.received[name].append({"kind": kind, "body": body, "headers": dict(request.headers)})
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        now = int(time.time())
        if kind == "embeddings":
            inp = body.get("input")
            n = len(inp) if isinstance(inp, list) else 1
            return web.json_response({"object": "list", "model": body.get("model"), "usage": usage,
                                      "data": [{"object": "embedding", "index": i, "embedding": [0.1, 0.2]} for i in range(n)]})  # fmt: skip
        text = self.reply(name, body)
        if kind == "completions":
            return web.json_response({"id": "cmpl-1", "object": "text_completion", "created": now, "model": body.get("model"),
                                      "choices": [{"index": 0, "text": text, "finish_reason": "stop"}], "usage": usage})  # fmt: skip
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                chunk = {"id": "c1", "object": "chat.completion.chunk", "created": now, "model": body.get("model"),
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": piece}, "finish_reason": None}]}  # fmt: skip
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            end = {"id": "c1", "object": "chat.completion.chunk", "created": now, "model": body.get("model"),
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}  # fmt: skip
            await resp.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
            await resp.write_eof()
            return resp
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "created": now, "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage,
        })  # fmt: skip

    def start(self) -> "Backend":
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_post("/{name}/v1/{kind:chat/completions|completions|embeddings}", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop:
            async def _stop():
                await self._runner.cleanup()

            asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
