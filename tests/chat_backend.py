"""A real OpenAI-compatible HTTP backend on 127.0.0.1 (aiohttp, in its own thread) for tests.

``POST /v1/chat/completions`` answers after ``delay_s`` with deterministic usage: prompt tokens =
words in the messages + 3, completion tokens = 1 + (sha256 of the text) % 40. ``fail_every`` > 0
makes every n-th request a 500.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid

from aiohttp import web

from litellm_energy_router.threaded_app import ThreadedApp


def expected_usage(text: str) -> tuple[int, int]:
    return len(text.split()) + 3, 1 + int(hashlib.sha256(text.encode()).hexdigest(), 16) % 40


class OpenAIBackend:
    def __init__(self, delay_s: float = 0.01, fail_every: int = 0) -> None:
        self.delay_s = delay_s
        self.fail_every = fail_every
        self.requests = 0
        self.port: int | None = None
        self._server = ThreadedApp(self._app, name="chat backend")

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests += 1
        if self.fail_every and self.requests % self.fail_every == 0:
            return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)
        text = " ".join(str(m.get("content", "")) for m in body["messages"])
        pt, ct = expected_usage(text)
        await asyncio.sleep(self.delay_s)
        return web.json_response({
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
        })  # fmt: skip

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    def __enter__(self) -> "OpenAIBackend":
        self.port = self._server.start().port
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def model_list(api_base: str) -> list[dict]:
    """Two deployments of one model group ``pool``: ids ``dep-small`` and ``dep-big``."""
    return [
        {"model_name": "pool", "litellm_params": {"model": "openai/small", "api_base": api_base, "api_key": "x"},
         "model_info": {"id": "dep-small"}},
        {"model_name": "pool", "litellm_params": {"model": "openai/big", "api_base": api_base, "api_key": "x"},
         "model_info": {"id": "dep-big"}},
    ]  # fmt: skip
