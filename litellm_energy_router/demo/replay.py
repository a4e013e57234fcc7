"""A local OpenAI-compatible backend that replays RouterBench's recorded answers.

``POST /v1/chat/completions`` with ``model`` = a candidate name answers that candidate's recorded
response for the prompt (the last user message), with ``usage`` in tiktoken ``cl100k_base`` tokens (the
unit of the energy profile and of the imported rows); an unknown prompt or candidate gets
:data:`FALLBACK_ANSWER`. Streaming is not supported (400). The same recordings give the demo its
"grader": the recorded correctness of (prompt, candidate), standing in for user feedback.

It binds 127.0.0.1 on a free port and runs its own event loop on a background thread
(:class:`~litellm_energy_router.threaded_app.ThreadedApp`)::

    with ReplayBackend(records) as backend:
        litellm.completion(model="openai/mistralai/mistral-7b-chat", api_base=backend.base_url, api_key="x",
                           messages=[{"role": "user", "content": prompt}])
"""

from __future__ import annotations

import threading
import time
from functools import lru_cache
from typing import Any, Iterable, Mapping

from ..tokens import count_prompt_tokens

FALLBACK_ANSWER = "I do not have a recorded answer to this question."


@lru_cache(maxsize=65536)
def _tokens(text: str) -> int:
    return count_prompt_tokens(text)


def last_user_text(messages: Any) -> str:
    """Text of the last user message (string content, or the text parts of a list)."""
    for m in reversed(messages or []):
        if isinstance(m, Mapping) and m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, str):
                return c
            if isinstance(c, list):
                return "".join(p.get("text", "") for p in c if isinstance(p, Mapping) and p.get("type", "text") == "text")
    return ""


class ReplayBackend:
    """Replays recorded answers over HTTP.

    Args:
        records: objects with ``prompt`` and ``answers`` (candidate -> (correctness in [0, 1], response
            text)), e.g. :class:`litellm_energy_router.profiling.routerbench.Record`. A prompt seen twice
            keeps its first record.
    """

    def __init__(self, records: Iterable[Any]) -> None:
        self._by_prompt: dict[str, Mapping[str, tuple[float, str]]] = {}
        for r in records:
            self._by_prompt.setdefault(r.prompt, dict(r.answers))
        self.candidates = sorted({c for a in self._by_prompt.values() for c in a})
        self.port: int | None = None
        self.requests = 0
        self.unknown = 0
        self._lock = threading.Lock()
        self._server: Any = None  # ThreadedApp while serving

    # -- what the demo asks directly ----------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (an OpenAI ``api_base``)."""
        if self.port is None:
            raise RuntimeError("replay backend not started")
        return f"http://127.0.0.1:{self.port}/v1"

    def answer(self, prompt: str, candidate: str) -> str:
        """The recorded response of ``candidate`` to ``prompt``, or :data:`FALLBACK_ANSWER`."""
        rec = self._by_prompt.get(prompt, {}).get(candidate)
        return rec[1] if rec is not None else FALLBACK_ANSWER

    def grade(self, prompt: str, candidate: str) -> float | None:
        """Recorded correctness of ``candidate`` on ``prompt`` (``None``: no recording)."""
        rec = self._by_prompt.get(prompt, {}).get(candidate)
        return float(rec[0]) if rec is not None else None

    # -- HTTP -------------------------------------------------------------------------------------------
    async def _chat(self, request: Any) -> Any:
        from aiohttp import web

        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "body is not JSON", "type": "invalid_request_error"}}, status=400)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return web.json_response({"error": {"message": "'messages' must be a list", "type": "invalid_request_error"}}, status=400)
        if body.get("stream"):
            return web.json_response({"error": {"message": "streaming is not supported by the replay backend",
                                                "type": "invalid_request_error"}}, status=400)  # fmt: skip
        model = str(body.get("model") or "")
        prompt = last_user_text(body["messages"])
        rec = self._by_prompt.get(prompt, {}).get(model)
        text = rec[1] if rec is not None else FALLBACK_ANSWER
        with self._lock:
            self.requests += 1
            self.unknown += rec is None
        pt, ct = _tokens(prompt), _tokens(text)
        return web.json_response({
            "id": f"replay-{self.requests}", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
        })  # fmt: skip

    def _app(self) -> Any:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    def start(self) -> "ReplayBackend":
        from ..threaded_app import ThreadedApp

        self._server = ThreadedApp(self._app, name="replay backend").start()
        self.port = self._server.port
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    def __enter__(self) -> "ReplayBackend":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
