"""GSM8K: grade-school maths word problems, graded by final-number extraction and numeric comparison."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, ClassVar, Mapping

from .base import Grade, GradeContext, HFSource, Task, TaskItem

_NUM = r"-?\$?\s?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?"
_MARKED = [
    re.compile(r"####\s*(" + _NUM + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUM + r")\s*\}"),
    # one run of separators on each side of "is" (adjacent optional \s* runs backtracked exponentially: a model
    # writing "answer" and 400 spaces held the event loop 43 s)
    re.compile(r"(?:final answer|the answer|answer)[\s:=*]*(?:is[\s:=*]*)?(" + _NUM + ")", re.IGNORECASE),
]
_ANY = re.compile(_NUM)


def parse_number(raw: str) -> float | None:
    """``"$1,234.50"`` → 1234.5; ``"3/4"`` → 0.75; None when it is not a number."""
    s = raw.replace("$", "").replace(",", "").replace(" ", "").rstrip(".")
    try:
        if "/" in s:
            return float(Fraction(s))
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def extract_number(text: str) -> float | None:
    """The final numeric answer in ``text``: the last "#### N", "\\boxed{N}" or "answer is N" when
    present, else the last number in the text."""
    for pattern in _MARKED:
        hits = pattern.findall(text)
        if hits and (v := parse_number(hits[-1])) is not None:
            return v
    for raw in reversed(_ANY.findall(text)):
        if (v := parse_number(raw)) is not None:
            return v
    return None


def numbers_equal(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


class GSM8K(Task):
    """GSM8K (``openai/gsm8k``, config ``main``): ``question``, ``answer`` ending in ``#### <number>``."""

    name = "gsm8k"
    hf = HFSource("openai/gsm8k", "main", "test")
    max_tokens: ClassVar[int] = 384

    def from_record(self, record: Mapping[str, Any], index: int) -> TaskItem:
        gold_text = str(record["answer"]).rsplit("####", 1)
        if len(gold_text) != 2 or (gold := parse_number(gold_text[1].strip())) is None:
            raise ValueError("field 'answer' does not end in '#### <number>'")
        prompt = (
            f"{str(record['question']).strip()}\n\nSolve the problem step by step, then give the final "
            "answer on its own line as '#### <number>'."
        )
        ref = gold_text[1].strip().replace(",", "")
        return TaskItem(self.name, str(record.get("id", index)), prompt, ref, {"gold": gold})

    async def grade(self, item: TaskItem, answer: str, ctx: GradeContext) -> Grade:
        got = extract_number(answer)
        if got is None:
            return Grade(0.0, "no number found")
        return Grade(1.0 if numbers_equal(got, item.data["gold"]) else 0.0, f"answered {got:g}")
