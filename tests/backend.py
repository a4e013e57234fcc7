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

from litellm_energy_router.threaded_app import ThreadedApp


class Backend:
    def __init__(self, delay_s: float = 0.0, reply=None):
        self.delay_s = delay_s
        self.reply = reply or (lambda name, body: f"answer from {name}")
        self.received: dict[str, list[dict]] = defaultdict(list)
        self._lock = threading.Lock()
        self.port = None
        self._server: ThreadedApp | None = None

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

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/{name}/v1/{kind:chat/completions|completions|embeddings}", self._handle)
        return app

    def start(self) -> "Backend":
        self._server = ThreadedApp(self._app, name="test backend").start()
        self.port = self._server.port
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
