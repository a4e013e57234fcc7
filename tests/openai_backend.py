"""A real OpenAI-compatible HTTP server on 127.0.0.1 for tests and benchmarks (aiohttp).

It answers the prompts of the committed task files (``tests/data/tasks``) the way a model of known
quality would: for model ``m`` and an item of task ``t`` the answer is right with probability
``accuracy[m][t]`` — decided by a hash of (seed, model, query id), so a rerun gets the same answers —
and is written in the task's format (several phrasings, so the graders' extraction is exercised).
The server finds the item by the prompt text, using the same task loaders and prompt formats as the
runner. Requests to ``judge_model`` are answered as an MT-Bench judge: ``[[10]]`` for an answer this
server produced as a good one, ``[[1]]`` otherwise. Prompts not in the task files are "open"
questions answered well with probability ``accuracy[m]["open"]``.

``log`` records every candidate request as ``(model, query_id, intended_correct)``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from litellm_energy_router.profiling.tasks import get_task, task_names
from litellm_energy_router.threaded_app import ThreadedApp
from litellm_energy_router.profiling.tasks.choice import LETTERS

TASK_DIR = Path(__file__).parent / "data" / "tasks"
_ANS = re.compile(r"\[The Start of Assistant's Answer\]\n(.*)\n\[The End of Assistant's Answer\]", re.DOTALL)
_QUESTION = re.compile(r"\[Question\]\n(.*?)\n\n\[The Start of", re.DOTALL)


def _u(*parts: Any) -> float:
    """Deterministic uniform [0, 1) from the parts."""
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def _fmt_num(x: float, style: int) -> str:
    s = f"{int(x)}" if float(x).is_integer() else f"{x:g}"
    if style == 1 and abs(x) >= 1000 and float(x).is_integer():
        s = f"{int(x):,}"
    return s


class Backend:
    def __init__(self, accuracy: dict[str, dict[str, float]], *, seed: int = 0, judge_model: str = "judge-model",
                 ttft_s: float = 0.0, per_token_s: float = 0.0, task_dir: Path = TASK_DIR) -> None:  # fmt: skip
        self.accuracy = accuracy
        self.seed = seed
        self.judge_model = judge_model
        self.ttft_s = ttft_s
        self.per_token_s = per_token_s
        self.log: list[tuple[str, str, bool]] = []
        self.judge_calls = 0
        self.fail_models: set[str] = set()
        self._good: set[str] = set()
        self.index: dict[str, Any] = {}
        for name in task_names():
            f = task_dir / f"{name}.jsonl"
            if f.exists():
                task = get_task(name)
                for item in task.load(f):
                    self.index[task.messages(item)[-1]["content"]] = item
        self._server: ThreadedApp | None = None
        self.port: int | None = None

    # -- answers ---------------------------------------------------------------------------------
    def correct(self, model: str, query_id: str, task: str) -> bool:
        return _u(self.seed, model, query_id) < self.accuracy[model].get(task, 0.0)

    def answer(self, model: str, prompt: str) -> tuple[str, str, bool]:
        item = self.index.get(prompt)
        if item is None:
            ok = self.correct(model, prompt, "open")
            return self._open(prompt, ok), f"open:{hashlib.sha1(prompt.encode()).hexdigest()[:12]}", ok
        ok = self.correct(model, item.query_id, item.task)
        style = int(_u("style", model, item.query_id) * 4)
        if item.task in ("mmlu", "arc_challenge", "hellaswag", "winogrande"):
            n = len(item.data["choices"])
            idx = item.data["gold"] if ok else (item.data["gold"] + 1) % n
            L, txt = LETTERS[idx], item.data["choices"][idx]
            text = [f"The answer is ({L}).", f"{L}", f"Answer: {L}. {txt}", f"**{L}**"][style]
        elif item.task == "gsm8k":
            g = item.data["gold"] if ok else item.data["gold"] + 1 + style
            x = _fmt_num(g, style)
            text = [f"Let's compute it step by step.\n#### {x}", f"So the answer is {x}.",
                    f"Adding everything up gives ${x}", f"Step 1: work it out.\nFinal answer: {x}"][style]  # fmt: skip
        elif item.task == "mbpp":
            name = re.match(r"assert\s+(\w+)\(", item.data["tests"][0]).group(1)
            code = item.reference if ok else f"def {name}(*args):\n    return None"
            text = f"Here is the solution:\n```python\n{code}\n```\nIt passes the tests." if style % 2 else f"```\n{code}\n```"
        elif item.task == "mt_bench":
            text = self._open(prompt, ok)
        else:  # pragma: no cover
            raise AssertionError(item.task)
        return text, item.query_id, ok

    def _open(self, prompt: str, ok: bool) -> str:
        if not ok:
            return "I am not sure."
        text = f"Here is a careful, complete answer about: {prompt[:60].strip()} (detailed explanation follows)."
        self._good.add(text)
        return text

    def judge(self, content: str) -> str:
        self.judge_calls += 1
        m = _ANS.search(content)
        answer = m.group(1) if m else ""
        rating = 10 if answer in self._good else 1
        return f"The assistant's answer is {'helpful' if rating > 5 else 'unhelpful'}. Rating: [[{rating}]]"

    # -- HTTP ------------------------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = body["model"]
        if model in self.fail_models:
            return web.json_response({"error": {"message": "injected failure", "type": "server_error"}}, status=500)
        messages = body["messages"]
        prompt = messages[-1]["content"]
        if model == self.judge_model:
            text = self.judge(prompt)
        else:
            text, qid, ok = self.answer(model, prompt)
            self.log.append((model, qid, ok))
        pieces = re.findall(r"\S+\s*|\s+", text) or [""]
        usage = {"prompt_tokens": sum(len(m["content"].split()) for m in messages), "completion_tokens": len(pieces)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        base = {"id": f"chatcmpl-{int(time.time() * 1e6)}", "created": int(time.time()), "model": model}
        if self.ttft_s:
            await asyncio.sleep(self.ttft_s)
        if not body.get("stream"):
            if self.per_token_s:
                await asyncio.sleep(self.per_token_s * len(pieces))
            return web.json_response({**base, "object": "chat.completion", "usage": usage, "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(f"data: {json.dumps({**base, 'object': 'chat.completion.chunk', **obj})}\n\n".encode())

        for i, piece in enumerate(pieces):
            delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
            await send({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            if self.per_token_s:
                await asyncio.sleep(self.per_token_s)
        await send({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({"choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _log(self, request: web.Request) -> web.Response:
        since = int(request.query.get("since", 0))
        return web.json_response({"log": self.log[since:], "judge_calls": self.judge_calls})

    # -- lifecycle -------------------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/_log", self._log)
        return app

    def start(self) -> str:
        """Serve in a background thread; returns the base URL (``http://127.0.0.1:<port>/v1``)."""
        self._server = ThreadedApp(self._app, name="task backend", backlog=256).start()
        self.port = self._server.port
        return self.url

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    @staticmethod
    def fetch_log(url: str, since: int = 0) -> list[tuple[str, str, bool]]:
        """The request log of a backend serving at ``url`` (e.g. one in another process)."""
        import urllib.request

        with urllib.request.urlopen(f"{url.rsplit('/v1', 1)[0]}/_log?since={since}", timeout=30) as r:
            return [tuple(x) for x in json.load(r)["log"]]

    def deployment(self, name: str, **extra: Any) -> dict[str, Any]:
        """A LiteLLM model_list entry pointing at this server for model ``name``."""
        return {"model_name": name, "litellm_params": {"model": f"openai/{name}", "api_base": self.url,
                                                       "api_key": "sk-test"}, **extra}  # fmt: skip


def main() -> None:
    """Serve in the foreground (for benchmarks: keeps the server off the client's GIL).

    ``python tests/openai_backend.py '<accuracy json>' [ttft_s] [per_token_s]``; prints the base URL."""
    import sys

    acc = json.loads(sys.argv[1])
    b = Backend(acc, ttft_s=float(sys.argv[2]) if len(sys.argv) > 2 else 0.0,
                per_token_s=float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)  # fmt: skip
    print(b.start(), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        b.stop()


if __name__ == "__main__":
    main()
