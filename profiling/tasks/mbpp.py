"""MBPP: write a Python function; graded by running the task's asserts in the code sandbox."""

from __future__ import annotations

import ast
import re
import textwrap
from typing import Any, ClassVar, Mapping

from .base import Grade, GradeContext, HFSource, Task, TaskError, TaskItem

#: a fenced block: ``` or ~~~ (three or more) at a line's start, indented or not (a list item's); closed by the same
#: fence (or a longer one) on a line of its own, or the end of the answer
_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+.-]*)[^\n]*\n(?P<body>.*?)(?:^[ \t]*(?P=fence)[`~]*[ \t]*[\w+-]*[ \t]*$|\Z)",
    re.M | re.S,
)
_BEGIN = re.compile(r"\[BEGIN\](.*?)(?:\[DONE\]|\Z)", re.DOTALL)
_PYTHON = ("python", "py", "python3", "")
_DEFINES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_CODE_START = re.compile(r"^(?:def |class |import |from |@|async def )", re.M)


def extract_code(text: str) -> str:
    """The program in an answer. Its fenced blocks (``` or ~~~, indented or not) in Python (or no language): every
    one that parses and defines a function or class, whole and in order (a helper in a block of its own joins the
    solution; a corrected later definition replaces the first), plus the imports of the other blocks that parse
    (usage examples and doctest sessions left out); else the first block that defines a function, else the first
    block. Without a fence: the ``[BEGIN] ... [DONE]`` span, else the text from its first definition
    or import up to the last line that still parses (trailing prose left out), else the text."""
    text = text.replace("\r\n", "\n")
    blocks = [(m["lang"].lower(), textwrap.dedent(m["body"])) for m in _FENCE.finditer(text)]
    if blocks:
        python = [b for lang, b in blocks if lang in _PYTHON] or [b for _, b in blocks]
        joined = _definitions(python)
        if joined:
            return joined
        for want in (lambda b: "def " in b, lambda b: True):
            for body in python:
                if want(body):
                    return body.strip("\n")
    if m := _BEGIN.search(text):
        return m.group(1).strip("\n")
    return _unfenced(text)


def _definitions(bodies: list[str]) -> str:
    """The blocks that parse and define a function or class, and the imports of the other blocks that parse, in
    order; ``""`` when no block defines anything."""
    parts, defines = [], False
    for body in bodies:
        try:
            tree = ast.parse(body)
        except SyntaxError:
            continue
        lines = body.split("\n")
        if any(isinstance(n, _DEFINES) for n in tree.body):  # whole: its module-level calls are the program's
            defines = True
            parts.append(body.strip("\n"))
        else:
            imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
            parts += ["\n".join(lines[n.lineno - 1 : n.end_lineno or n.lineno]) for n in imports]
    return "\n\n".join(p for p in parts if p) if defines else ""


def _unfenced(text: str) -> str:
    """An answer without fences: from its first definition or import to the last line that still parses."""
    m = _CODE_START.search(text)
    if m is None:
        return text.strip("\n")
    lines = text[m.start() :].rstrip("\n").split("\n")
    for end in range(len(lines), 0, -1):
        code = "\n".join(lines[:end]).rstrip()
        try:
            ast.parse(code)
        except SyntaxError:
            continue
        return code
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
