"""LLM-as-judge grading (MT-Bench single-answer grading): a judge model rates an answer 1–10.

The judge is any LiteLLM deployment (``judge:`` in the tournament config); the runner hands
:class:`Judge` an async ``complete(messages) -> text`` function bound to it. The rating is read
from ``[[N]]`` and mapped to a score in [0, 1] as ``(N - 1) / 9`` (1 → 0.0, 10 → 1.0).
Prompts follow FastChat's ``single-v1`` / ``single-math-v1`` judge prompts (Apache-2.0).
"""

from __future__ import annotations

import re
from typing import Awaitable, Callable

from .tasks.base import Grade

Complete = Callable[[list[dict[str, str]]], Awaitable[str]]

SYSTEM = "You are a helpful assistant."
_PROMPT = (
    "[Instruction]\nPlease act as an impartial judge and evaluate the quality of the response provided by an "
    "AI assistant to the user question displayed below. Your evaluation should consider factors such as the "
    "helpfulness, relevance, accuracy, depth, creativity, and level of detail of the response. Begin your "
    "evaluation by providing a short explanation. Be as objective as possible. After providing your "
    "explanation, you must rate the response on a scale of 1 to 10 by strictly following this format: "
    '"[[rating]]", for example: "Rating: [[5]]".\n\n'
    "[Question]\n{question}\n\n[The Start of Assistant's Answer]\n{answer}\n[The End of Assistant's Answer]"
)
_PROMPT_REF = (
    "[Instruction]\nPlease act as an impartial judge and evaluate the quality of the response provided by an "
    "AI assistant to the user question displayed below. Your evaluation should consider correctness and "
    "helpfulness. You will be given a reference answer and the assistant's answer. Begin your evaluation by "
    "comparing the assistant's answer with the reference answer. Identify and correct any mistakes. Be as "
    "objective as possible. After providing your explanation, you must rate the response on a scale of 1 to 10 "
    'by strictly following this format: "[[rating]]", for example: "Rating: [[5]]".\n\n'
    "[Question]\n{question}\n\n[The Start of Reference Answer]\n{reference}\n[The End of Reference Answer]\n\n"
    "[The Start of Assistant's Answer]\n{answer}\n[The End of Assistant's Answer]"
)
_RATING = [  # tried in order: a bare [N] last (a judge citing "sources [1] and [2]" before "Rating: 8")
    re.compile(r"\[\[(\d+(?:\.\d+)?)\]\]"),
    re.compile(r"[Rr]ating:\s*(\d+(?:\.\d+)?)"),
    re.compile(r"\[(\d+(?:\.\d+)?)\]"),
]


def judge_messages(question: str, answer: str, reference: str | None = None) -> list[dict[str, str]]:
    """The messages sent to the judge (with the reference-guided prompt when ``reference`` is given)."""
    body = (_PROMPT_REF if reference else _PROMPT).format(question=question, answer=answer, reference=reference)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": body}]


def parse_rating(text: str) -> float | None:
    """The last rating in 1–10 found as ``[[N]]`` (else ``Rating: N``, else ``[N]``), or None."""
    for pattern in _RATING:
        values = [float(v) for v in pattern.findall(text) if 1 <= float(v) <= 10]
        if values:
            return values[-1]
    return None


def rating_to_score(rating: float) -> float:
    """Map a 1–10 rating to [0, 1]."""
    return (rating - 1.0) / 9.0


class Judge:
    """Rates answers with a judge deployment. ``complete`` sends messages, returns the reply text."""

    def __init__(self, complete: Complete, name: str = "judge") -> None:
        self.complete = complete
        self.name = name

    async def rate(self, question: str, answer: str, reference: str | None = None) -> Grade:
        reply = await self.complete(judge_messages(question, answer, reference))
        rating = parse_rating(reply or "")
        if rating is None:
            # the reply's length, not its text: a judge restates the question (production text in a shadow run)
            return Grade(None, f"judge {self.name} gave no [[rating]] (a reply of {len(reply or '')} characters)")
        return Grade(rating_to_score(rating), f"judge rating {rating:g}")
