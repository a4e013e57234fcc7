"""Multiple-choice tasks (MMLU, ARC-Challenge, HellaSwag, WinoGrande) and answer-letter extraction.

All four share one prompt format (question, lettered options, "answer with the letter") and one
grader: :func:`extract_choice` finds the chosen letter in free text; the score is 1 when it is the
gold letter, else 0.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from typing import Any, ClassVar, Mapping, Sequence

from .base import Grade, GradeContext, HFSource, Task, TaskItem

LETTERS = "ABCDEFGHIJ"

_AFTER_KEYWORD = (
    # one run of separators between the words (adjacent optional \s* runs backtracked exponentially)
    r"[\s:\-]*(?:(?:is|would be)[\s:\-]*)?(?:(?:option|choice|letter)[\s:\-]*)?[\(\[\*\"']*([A-J])(?![A-Za-z])"
)
#: "the answer is (B)", "Answer: B": what the model says it answers
_ANSWER = re.compile(r"answer" + _AFTER_KEYWORD, re.IGNORECASE)
#: "option B", "choice B": a mention, which an explanation also makes ("option D is Madrid"): read after the answer
#: phrase, the leading letter and a bold letter
_OPTION = re.compile(r"(?:option|choice)" + _AFTER_KEYWORD, re.IGNORECASE)
_LEADING = re.compile(r"^\s*[\(\[\*\"']*([A-J])(?:\s*[\)\]\.\:\*\"']|\s*$)")
_PAREN = re.compile(r"[\(\[]([A-J])[\)\]]")
_BOLD = re.compile(r"\*\*\s*\(?([A-J])\)?[\.\):]?\s*\*\*")
_AFTER_LOWER = re.compile(r"\s*(?:[\)\].:*\"']|$)")  # what may follow a lower-case letter read after the keyword
_ARTICLE_A = re.compile(r"\bA\s+[a-z]")
_LONE = re.compile(r"(?<![A-Za-z'])([A-J])(?![A-Za-z'])")


def extract_choice(text: str, choices: Sequence[str]) -> int | None:
    """Index of the option chosen in ``text``, or None.

    Tried in order: "answer is (B)" / "Answer: B" phrasing (the last such phrase wins), a leading
    letter ("B.", "(B)", "B"), a single bold letter ("**B**"), "option B" / "choice B" (the last wins: an
    explanation mentions options too), a single parenthesised letter, exactly one option's text quoted in
    the answer, a single standalone capital letter. Letters beyond ``len(choices)`` are ignored.
    """
    n = len(choices)
    valid = set(LETTERS[:n])

    def pick(found: list[str]) -> int | None:
        found = [f.upper() for f in found if f.upper() in valid]
        return LETTERS.index(found[-1]) if found else None

    # a lower-case letter after the keyword only when nothing word-like follows it:
    # "the answer is a fox" must not read as (A), "answer: b" does read as (B)
    def keyword(pattern: re.Pattern[str]) -> int | None:
        return pick(
            [m.group(1) for m in pattern.finditer(text) if m.group(1).isupper() or _AFTER_LOWER.match(text, m.end())]
        )

    if (r := keyword(_ANSWER)) is not None:
        return r
    if (m := _LEADING.match(text)) and m.group(1) in valid:
        return LETTERS.index(m.group(1))
    if (r := _single(_BOLD, text, valid)) is not None:
        return r
    if (r := keyword(_OPTION)) is not None:
        return r
    if (r := _single(_PAREN, text, valid)) is not None:
        return r
    lowered = " ".join(text.lower().split())
    quoted = [i for i, c in enumerate(choices) if len(c.strip()) > 2 and " ".join(c.lower().split()) in lowered]
    if len(quoted) == 1:
        return quoted[0]
    article = _ARTICLE_A.search(text) is not None  # "A dog ..." is no answer A
    lone = {h for h in _LONE.findall(text) if h in valid and not (h == "A" and article)}
    if len(lone) == 1:
        return LETTERS.index(lone.pop())
    return None


class MultipleChoiceTask(Task):
    """Shared prompt and grader; subclasses map a record to (question, options, gold index)."""

    max_tokens: ClassVar[int] = 32
    instruction: ClassVar[str] = "Answer with the letter of the correct option."

    @abstractmethod
    def parse(self, record: Mapping[str, Any], index: int) -> tuple[str, str, list[str], int]:
        """(item id, question text, options, gold option index)."""

    def from_record(self, record: Mapping[str, Any], index: int) -> TaskItem:
        item_id, question, options, gold = self.parse(record, index)
        options = [str(o) for o in options]
        if not 2 <= len(options) <= len(LETTERS):
            raise ValueError(f"field 'choices': {len(options)} options (need 2-{len(LETTERS)})")
        if not 0 <= gold < len(options):
            raise ValueError(f"gold answer index {gold} out of range for {len(options)} options")
        if not isinstance(question, str):
            raise ValueError(f"the question is a {type(question).__name__}, not text")
        lines = [question.strip(), ""] + [f"{LETTERS[i]}. {o}" for i, o in enumerate(options)]
        prompt = "\n".join(lines + ["", self.instruction])
        return TaskItem(self.name, str(item_id), prompt, LETTERS[gold], {"choices": options, "gold": gold})

    async def grade(self, item: TaskItem, answer: str, ctx: GradeContext) -> Grade:
        got = extract_choice(answer, item.data["choices"])
        if got is None:
            return Grade(0.0, "no option letter found")
        return Grade(1.0 if got == item.data["gold"] else 0.0, f"chose {LETTERS[got]}")


class MMLU(MultipleChoiceTask):
    """MMLU (``cais/mmlu``, config ``all``): ``question``, ``subject``, ``choices`` (4), ``answer`` (0-3)."""

    name = "mmlu"
    hf = HFSource("cais/mmlu", "all", "test")

    def parse(self, r: Mapping[str, Any], index: int) -> tuple[str, str, list[str], int]:
        subject = str(r.get("subject") or "").replace("_", " ")
        head = f"The following is a multiple choice question about {subject}.\n\n" if subject else ""
        return r.get("id", index), head + r["question"], list(r["choices"]), int(r["answer"])


class ARCChallenge(MultipleChoiceTask):
    """ARC-Challenge (``allenai/ai2_arc``): ``id``, ``question``, ``choices{text,label}``, ``answerKey``."""

    name = "arc_challenge"
    hf = HFSource("allenai/ai2_arc", "ARC-Challenge", "test")

    def parse(self, r: Mapping[str, Any], index: int) -> tuple[str, str, list[str], int]:
        labels = [str(x) for x in r["choices"]["label"]]
        key = str(r["answerKey"])
        if key not in labels:
            raise ValueError(f"field 'answerKey' = {key!r} is not one of the labels {labels}")
        return r["id"], r["question"], list(r["choices"]["text"]), labels.index(key)


class HellaSwag(MultipleChoiceTask):
    """HellaSwag (``Rowan/hellaswag``, validation split — test labels are hidden): ``ind``, ``ctx``,
    ``endings`` (4), ``label`` ("0"-"3"), ``activity_label``."""

    name = "hellaswag"
    hf = HFSource("Rowan/hellaswag", None, "validation")
    instruction = "Which ending is the most plausible? Answer with the letter of the correct option."

    def parse(self, r: Mapping[str, Any], index: int) -> tuple[str, str, list[str], int]:
        topic = f"{r['activity_label']}: " if r.get("activity_label") else ""
        return (
            r.get("ind", index),
            f"Complete the description.\n\n{topic}{r['ctx']}",
            list(r["endings"]),
            int(r["label"]),
        )


class WinoGrande(MultipleChoiceTask):
    """WinoGrande (``allenai/winogrande``, ``winogrande_xl``, validation split): ``sentence`` with a
    ``_`` blank, ``option1``, ``option2``, ``answer`` ("1" or "2")."""

    name = "winogrande"
    hf = HFSource("allenai/winogrande", "winogrande_xl", "validation")
    instruction = "Which option correctly fills the blank (_)? Answer with the letter of the correct option."

    def parse(self, r: Mapping[str, Any], index: int) -> tuple[str, str, list[str], int]:
        return (
            r.get("id", index),
            f"Fill in the blank.\n\n{r['sentence']}",
            [r["option1"], r["option2"]],
            int(r["answer"]) - 1,
        )


def _single(pattern: re.Pattern[str], text: str, valid: set[str]) -> int | None:
    """The letter when ``pattern`` finds exactly one valid one in ``text``."""
    hits = {h for h in pattern.findall(text) if h in valid}
    return LETTERS.index(hits.pop()) if len(hits) == 1 else None
