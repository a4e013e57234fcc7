"""The one local OpenAI-compatible backend of the project: the demo's replay server, the tests' and the
benchmarks' fake models, and ``energy-router replay-backend``.

An aiohttp application on 127.0.0.1 (a free port unless one is asked for), served by its own event loop
on a background thread (:class:`~litellm_energy_router.threaded_app.ThreadedApp`). Routes:

- ``POST /v1/chat/completions`` (streaming too: one SSE chunk per word; the usage rides on the last
  chunk, or on a chunk of its own when ``stream_options.include_usage`` asks for it, as OpenAI does),
  ``POST /v1/completions`` and ``POST /v1/embeddings``;
- the same under a name prefix, ``/<name>/v1/...``, so one server stands for many backends (each
  deployment's ``api_base`` = :meth:`LocalBackend.base`); :attr:`LocalBackend.received` keeps what every
  name received (the name is the body's ``model`` without a prefix);
- ``GET /_log``: the answer source's log (:class:`TaskAnswers`), for a server in another process.

*What* it answers comes from an answer source — any object with ``answer(name, messages) -> (text,
(prompt tokens, completion tokens))``:

- :class:`EchoAnswers` (default): ``"answer from <name>"``, usage by :func:`expected_usage`;
- :class:`ReplayAnswers`: RouterBench's recorded responses (the demo; ``energy-router replay-backend``);
- :class:`~litellm_energy_router.demo.task_answers.TaskAnswers`: answers of known accuracy to the task
  files' prompts, in each task's format, and an MT-Bench judge (tournament tests and benchmarks).

Timing and faults: ``delay_s`` before the first token, ``per_token_s`` per word, ``fail_every`` (every
n-th request a 500), :attr:`LocalBackend.fail_models` (500 for those models)::

    with LocalBackend(ReplayAnswers(records)) as backend:
        litellm.completion(model="openai/mistralai/mistral-7b-chat", api_base=backend.base_url, api_key="x",
                           messages=[{"role": "user", "content": prompt}])
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import time
import uuid
from collections import defaultdict
from functools import lru_cache
from typing import Any, Iterable, Mapping, Protocol

from aiohttp import web

from litellm_energy_router.threaded_app import ThreadedApp

FALLBACK_ANSWER = "I do not have a recorded answer to this question."
Usage = tuple[int, int]  # (prompt tokens, completion tokens)


class Answers(Protocol):
    """An answer source: the reply text and its usage (tokens) for a request to backend ``name``."""

    def answer(self, name: str, messages: list[dict[str, Any]]) -> tuple[str, Usage]: ...


def messages_text(messages: Any) -> str:
    """All message contents joined by spaces (non-string contents as their ``str``)."""
    return " ".join(str(m.get("content", "")) for m in messages or [] if isinstance(m, Mapping))


def last_user_text(messages: Any) -> str:
    """Text of the last user message (string content, or the text parts of a list)."""
    for m in reversed(messages or []):
        if isinstance(m, Mapping) and m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, str):
                return c
            if isinstance(c, list):
                return "".join(
                    p.get("text", "") for p in c if isinstance(p, Mapping) and p.get("type", "text") == "text"
                )
    return ""


def expected_usage(text: str) -> Usage:
    """:class:`EchoAnswers`' usage for the messages' text: prompt tokens = words + 3, completion tokens =
    1 + (sha256 of the text) % 40."""
    return len(text.split()) + 3, 1 + int(hashlib.sha256(text.encode()).hexdigest(), 16) % 40


class EchoAnswers:
    """``"answer from <name>"``, usage :func:`expected_usage` of the messages' text."""

    def answer(self, name: str, messages: list[dict[str, Any]]) -> tuple[str, Usage]:
        return f"answer from {name}", expected_usage(messages_text(messages))


@lru_cache(maxsize=65536)
def _tokens(text: str) -> int:
    from litellm_energy_router.tokens import count_prompt_tokens

    return count_prompt_tokens(text)


class ReplayAnswers:
    """Replays recorded answers: for model ``m`` the recorded response of candidate ``m`` to the last user
    message, else :data:`FALLBACK_ANSWER`; usage in tiktoken ``cl100k_base`` tokens (the unit of the energy
    profile and of the imported rows). The recordings also give the demo its "grader" (:meth:`grade`).

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
        self.unknown = 0  # requests answered with the fallback

    def answer(self, name: str, messages: list[dict[str, Any]]) -> tuple[str, Usage]:
        prompt = last_user_text(messages)
        rec = self._by_prompt.get(prompt, {}).get(name)
        self.unknown += rec is None
        text = rec[1] if rec is not None else FALLBACK_ANSWER
        return text, (_tokens(prompt), _tokens(text))

    def grade(self, prompt: str, candidate: str) -> float | None:
        """Recorded correctness of ``candidate`` on ``prompt`` (``None``: no recording)."""
        rec = self._by_prompt.get(prompt, {}).get(candidate)
        return float(rec[0]) if rec is not None else None


def deployment_id(model: str) -> str:
    """The default ``model_info.id`` of a deployment of ``model``: ``replay-<model, / as -->``."""
    return "replay-" + model.replace("/", "--")


def deployment(
    api_base: str, model: str, *, group: str | None = None, id: str | None = None, candidate: bool = False
) -> dict[str, Any]:
    """A LiteLLM model_list entry for ``model`` at ``api_base`` in model group ``group`` (default: the
    model's name). ``id`` sets ``model_info.id``; ``candidate`` tags the deployment with
    ``model_info.energy_router_candidate = model`` (how the router maps a deployment to a candidate)."""
    entry: dict[str, Any] = {
        "model_name": group or model,
        "litellm_params": {"model": f"openai/{model}", "api_base": api_base, "api_key": "sk-local"},
    }
    info = {**({"id": id} if id else {}), **({"energy_router_candidate": model} if candidate else {})}
    return {**entry, "model_info": info} if info else entry


def model_list(
    api_base: str, models: Iterable[str], *, group: str, ids: Iterable[str] | None = None, candidates: bool = True
) -> list[dict[str, Any]]:
    """One deployment per model in the group ``group`` at ``api_base``, ``model_info.id`` from ``ids``
    (default :func:`deployment_id`), tagged as energy-router candidates unless ``candidates`` is false."""
    models = list(models)
    ids = list(ids) if ids is not None else [deployment_id(m) for m in models]
    return [deployment(api_base, m, group=group, id=i, candidate=candidates) for m, i in zip(models, ids)]


def _error(message: str, status: int, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)


class LocalBackend:
    """The server. Args: ``answers`` (default :class:`EchoAnswers`); ``delay_s``: seconds before the first
    token (before the whole answer when not streaming); ``per_token_s``: seconds per streamed word (added
    per word to an answer that is not streamed); ``fail_every``: every n-th request answers 500 (0: none);
    ``port``: 0 for a free one; ``backlog``: listen backlog, connections."""

    def __init__(
        self,
        answers: Answers | None = None,
        *,
        delay_s: float = 0.0,
        per_token_s: float = 0.0,
        fail_every: int = 0,
        port: int = 0,
        backlog: int = 256,
    ) -> None:
        self.answers: Answers = answers if answers is not None else EchoAnswers()
        self.delay_s, self.per_token_s, self.fail_every = delay_s, per_token_s, fail_every
        self.fail_models: set[str] = set()  # models answered with a 500
        self.received: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.requests = 0
        self.port: int | None = None
        self._want_port, self._backlog = port, backlog
        self._lock = threading.Lock()
        self._server: ThreadedApp | None = None

    # -- addresses --------------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (an OpenAI ``api_base``)."""
        if self.port is None:
            raise RuntimeError("local backend not started")
        return f"http://127.0.0.1:{self.port}/v1"

    def base(self, name: str) -> str:
        """The ``api_base`` of backend ``name`` on this server (``http://127.0.0.1:<port>/<name>/v1``)."""
        return self.base_url[: -len("/v1")] + f"/{name}/v1"

    def deployment(self, name: str, **extra: Any) -> dict[str, Any]:
        """A LiteLLM model_list entry of its own group ``name`` for model ``name`` on this server."""
        return {**deployment(self.base_url, name), **extra}

    def count(self, name: str) -> int:
        """Requests backend ``name`` received."""
        with self._lock:
            return len(self.received[name])

    # -- HTTP -------------------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        try:
            body = await request.json()
        except ValueError:
            return _error("body is not JSON", 400)
        if not isinstance(body, dict):
            return _error("body is not a JSON object", 400)
        model = str(body.get("model") or "")
        name = request.match_info.get("name") or model
        with self._lock:
            self.requests += 1
            n = self.requests
            self.received[name].append({"kind": kind, "body": body, "headers": dict(request.headers)})
        if (self.fail_every and n % self.fail_every == 0) or model in self.fail_models:
            return _error("injected failure", 500, "server_error")
        if kind == "embeddings":
            return self._embeddings(body)
        if kind == "completions":
            messages = [{"role": "user", "content": str(body.get("prompt") or "")}]
        elif isinstance(body.get("messages"), list):
            messages = body["messages"]
        else:
            return _error("'messages' must be a list", 400)
        text, (pt, ct) = self.answers.answer(name, messages)
        usage = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
        pieces = re.findall(r"\S+\s*|\s+", text) or [""]
        base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if kind == "chat/completions" and body.get("stream"):
            return await self._stream(request, body, base, pieces, usage)
        if self.per_token_s:
            await asyncio.sleep(self.per_token_s * len(pieces))
        if kind == "completions":
            return web.json_response(
                {
                    **base,
                    "object": "text_completion",
                    "usage": usage,
                    "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
                }
            )
        return web.json_response(
            {
                **base,
                "object": "chat.completion",
                "usage": usage,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            }
        )

    async def _stream(
        self, request: web.Request, body: dict[str, Any], base: dict[str, Any], pieces: list[str], usage: dict[str, int]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(f"data: {json.dumps({**base, 'object': 'chat.completion.chunk', **obj})}\n\n".encode())

        for i, piece in enumerate(pieces):
            delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
            await send({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            if self.per_token_s:
                await asyncio.sleep(self.per_token_s)
        separate = bool((body.get("stream_options") or {}).get("include_usage"))
        last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await send(last if separate else {**last, "usage": usage})
        if separate:
            await send({"choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _embeddings(self, body: dict[str, Any]) -> web.Response:
        inp = body.get("input")
        items = inp if isinstance(inp, list) else [inp]
        pt = sum(expected_usage(str(x))[0] for x in items)
        return web.json_response(
            {
                "object": "list",
                "model": body.get("model"),
                "usage": {"prompt_tokens": pt, "total_tokens": pt},
                "data": [{"object": "embedding", "index": i, "embedding": [0.1, 0.2]} for i in range(len(items))],
            }
        )

    async def _log(self, request: web.Request) -> web.Response:
        since = int(request.query.get("since", 0))
        log = list(getattr(self.answers, "log", []))
        return web.json_response({"log": log[since:], "judge_calls": getattr(self.answers, "judge_calls", 0)})

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        kinds = "{kind:chat/completions|completions|embeddings}"
        app.router.add_post(f"/v1/{kinds}", self._handle)
        app.router.add_post(f"/{{name}}/v1/{kinds}", self._handle)
        app.router.add_get("/_log", self._log)
        return app

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> "LocalBackend":
        """Serve on a background thread; raises :class:`RuntimeError` naming the cause when it cannot."""
        self._server = ThreadedApp(self._app, name="local backend", backlog=self._backlog, port=self._want_port).start()
        self.port = self._server.port
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    def __enter__(self) -> "LocalBackend":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def fetch_log(base_url: str, since: int = 0) -> list[tuple[str, str, bool]]:
    """The answer log of a backend serving at ``base_url`` (e.g. one in another process)."""
    import urllib.request

    with urllib.request.urlopen(f"{base_url.rsplit('/v1', 1)[0]}/_log?since={since}", timeout=30) as r:
        return [tuple(x) for x in json.load(r)["log"]]
