"""An answer source for :class:`~litellm_energy_router.demo.backend.LocalBackend`: answers of known quality
to the prompts of task files (the tournament's tests and benchmarks).

For model ``m`` and an item of task ``t`` the answer is right with probability ``accuracy[m][t]`` — decided
by a hash of (seed, model, query id), so a rerun gets the same answers — and is written in the task's
format (several phrasings, so the graders' extraction is exercised). The item is found by the prompt text,
using the same task loaders and prompt formats as the runner. Requests to ``judge_model`` are answered as
an MT-Bench judge: ``[[10]]`` for an answer this source produced as a good one, ``[[1]]`` otherwise.
Prompts not in the task files are "open" questions answered well with probability ``accuracy[m]["open"]``.

:attr:`TaskAnswers.log` records every candidate request as ``(model, query_id, intended_correct)``.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from litellm_energy_router.profiling.tasks import get_task, task_names
from litellm_energy_router.profiling.tasks.choice import LETTERS

_ANS = re.compile(r"\[The Start of Assistant's Answer\]\n(.*)\n\[The End of Assistant's Answer\]", re.DOTALL)


def _u(*parts: Any) -> float:
    """Deterministic uniform [0, 1) from the parts."""
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def _fmt_num(x: float, style: int) -> str:
    s = f"{int(x)}" if float(x).is_integer() else f"{x:g}"
    if style == 1 and abs(x) >= 1000 and float(x).is_integer():
        s = f"{int(x):,}"
    return s


class TaskAnswers:
    """Args: ``accuracy`` (model -> task -> probability of a right answer), ``task_dir`` (the
    ``<task>.jsonl`` files whose prompts it knows), ``seed``, ``judge_model`` (the model name answered as
    the judge). Usage: prompt tokens = words in the messages, completion tokens = words in the answer."""

    def __init__(
        self, accuracy: dict[str, dict[str, float]], task_dir: Path, *, seed: int = 0, judge_model: str = "judge-model"
    ) -> None:
        self.accuracy = accuracy
        self.seed = seed
        self.judge_model = judge_model
        self.log: list[tuple[str, str, bool]] = []
        self.judge_calls = 0
        self._good: set[str] = set()
        self.index: dict[str, Any] = {}
        for name in task_names():
            f = Path(task_dir) / f"{name}.jsonl"
            if f.exists():
                task = get_task(name)
                for item in task.load(f):
                    self.index[task.messages(item)[-1]["content"]] = item

    def answer(self, name: str, messages: list[dict[str, Any]]) -> tuple[str, tuple[int, int]]:
        prompt = str(messages[-1].get("content", "")) if messages else ""
        if name == self.judge_model:
            text = self.judge(prompt)
        else:
            text, qid, ok = self.reply(name, prompt)
            self.log.append((name, qid, ok))
        pt = sum(len(str(m.get("content", "")).split()) for m in messages)
        return text, (pt, len(re.findall(r"\S+\s*|\s+", text)) or 1)

    def correct(self, model: str, query_id: str, task: str) -> bool:
        """Whether ``model``'s answer to ``query_id`` is meant to be right."""
        return _u(self.seed, model, query_id) < self.accuracy[model].get(task, 0.0)

    def reply(self, model: str, prompt: str) -> tuple[str, str, bool]:
        """(answer text, query id, meant to be right) of ``model`` for ``prompt``."""
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
            text = [
                f"Let's compute it step by step.\n#### {x}",
                f"So the answer is {x}.",
                f"Adding everything up gives ${x}",
                f"Step 1: work it out.\nFinal answer: {x}",
            ][style]
        elif item.task == "mbpp":
            name = re.match(r"assert\s+(\w+)\(", item.data["tests"][0]).group(1)
            code = item.reference if ok else f"def {name}(*args):\n    return None"
            text = (
                f"Here is the solution:\n```python\n{code}\n```\nIt passes the tests."
                if style % 2
                else f"```\n{code}\n```"
            )
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
        """The judge's verdict on the answer quoted in ``content``."""
        self.judge_calls += 1
        m = _ANS.search(content)
        answer = m.group(1) if m else ""
        rating = 10 if answer in self._good else 1
        return f"The assistant's answer is {'helpful' if rating > 5 else 'unhelpful'}. Rating: [[{rating}]]"


def main() -> None:
    """Serve in the foreground (benchmarks: keeps the server off the client's GIL); prints the base URL.

    ``python -m litellm_energy_router.demo.task_answers '<accuracy json>' TASK_DIR [delay_s] [per_token_s]``"""
    import json
    import sys
    import threading

    from litellm_energy_router.demo.backend import LocalBackend

    acc, task_dir = json.loads(sys.argv[1]), Path(sys.argv[2])
    delay_s, per_token_s = (float(sys.argv[i]) if len(sys.argv) > i else 0.0 for i in (3, 4))
    backend = LocalBackend(TaskAnswers(acc, task_dir), delay_s=delay_s, per_token_s=per_token_s).start()
    print(backend.base_url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        backend.stop()


if __name__ == "__main__":
    main()
