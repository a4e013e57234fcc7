"""MBPP: write a Python function; graded by running the task's asserts in the code sandbox."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Mapping

from .base import Grade, GradeContext, HFSource, Task, TaskError, TaskItem

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_BEGIN = re.compile(r"\[BEGIN\](.*?)(?:\[DONE\]|\Z)", re.DOTALL)


def extract_code(text: str) -> str:
    """The program in an answer: the first fenced block (```python preferred) that defines a
    function, else the first fenced block, else the ``[BEGIN] ... [DONE]`` span, else the text."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    for want in (
        lambda lang, b: lang in ("python", "py", "python3") and "def " in b,
        lambda lang, b: "def " in b,
        lambda lang, b: True,
    ):
        for lang, body in blocks:
            if want(lang, body):
                return body.strip("\n")
    if m := _BEGIN.search(text):
        return m.group(1).strip("\n")
    return text.strip("\n")


class MBPP(Task):
    """MBPP (``google-research-datasets/mbpp``, config ``full``): ``task_id``, ``text``, ``code``
    (reference solution), ``test_list`` (asserts), ``test_setup_code``."""

    name = "mbpp"
    hf = HFSource("google-research-datasets/mbpp", "full", "test")
    max_tokens: ClassVar[int] = 512

    def from_record(self, record: Mapping[str, Any], index: int) -> TaskItem:
        tests = [str(t) for t in record["test_list"]]
        if not tests:
            raise ValueError("field 'test_list' is empty")
        prompt = (
            f"You are an expert Python programmer, and here is your task: {str(record['text']).strip()} "
            "Your code should pass these tests:\n\n" + "\n".join(tests) + "\n\n"
            "Answer with the complete Python code in one ```python code block."
        )
        setup = str(record.get("test_setup_code") or "")
        return TaskItem(
            self.name,
            str(record.get("task_id", index)),
            prompt,
            str(record.get("code") or "") or None,
            {"tests": tests, "setup": setup},
        )

    async def grade(self, item: TaskItem, answer: str, ctx: GradeContext) -> Grade:
        if ctx.sandbox is None:
            raise TaskError("task mbpp needs a code sandbox (GradeContext.sandbox)")
        code = extract_code(answer)
        tests = "\n".join([item.data["setup"], *item.data["tests"]])
        result = await ctx.sandbox.run(code, tests)
        note = f"sandbox isolation={result.isolation} (not isolated)" if result.isolation == "process" else None
        return Grade(1.0 if result.passed else 0.0, result.reason, note)
