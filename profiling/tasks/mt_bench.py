"""MT-Bench-style open questions, graded 1–10 by an LLM judge and mapped to [0, 1].

Only the first turn of each MT-Bench question is asked (the table holds single-turn queries).
Categories math, reasoning and coding use the reference-guided judge prompt when a reference exists.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from .base import Grade, GradeContext, HFSource, Task, TaskError, TaskItem

REFERENCE_CATEGORIES = {"math", "reasoning", "coding"}


class MTBench(Task):
    """MT-Bench (``HuggingFaceH4/mt_bench_prompts``): ``prompt_id``, ``category``, ``prompt`` (list of
    turns), ``reference`` (list, may be empty)."""

    name = "mt_bench"
    hf = HFSource("HuggingFaceH4/mt_bench_prompts", None, "train")
    max_tokens: ClassVar[int] = 512

    def from_record(self, record: Mapping[str, Any], index: int) -> TaskItem:
        turns = record["prompt"]
        question = turns[0] if isinstance(turns, (list, tuple)) else str(turns)
        if not str(question).strip():
            raise ValueError("field 'prompt' is empty")
        refs = record.get("reference") or []
        ref = (str(refs[0]) if refs else None) if isinstance(refs, (list, tuple)) else str(refs)
        category = str(record.get("category") or "")
        use_ref = ref if category in REFERENCE_CATEGORIES else None
        return TaskItem(
            self.name,
            str(record.get("prompt_id", index)),
            str(question),
            ref,
            {"category": category, "judge_reference": use_ref},
        )

    async def grade(self, item: TaskItem, answer: str, ctx: GradeContext) -> Grade:
        if ctx.judge is None:
            raise TaskError("task mt_bench needs a judge deployment ('judge:' in the tournament config)")
        return await ctx.judge.rate(item.prompt, answer, item.data.get("judge_reference"))
