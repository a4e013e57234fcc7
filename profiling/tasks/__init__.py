"""Benchmark tasks: one interface (:class:`Task`), one registry (:func:`register_task`, :func:`get_task`).

Built in: ``mmlu``, ``arc_challenge``, ``hellaswag``, ``winogrande`` (multiple choice), ``gsm8k``
(final number), ``mbpp`` (code run in a sandbox), ``mt_bench`` (LLM judge).
"""

from .base import (
    Grade,
    GradeContext,
    HFSource,
    Task,
    TaskError,
    TaskItem,
    get_task,
    register_task,
    sample_items,
    task_names,
)
from . import choice, gsm8k, mbpp, mt_bench  # noqa: E402,F401  (register the built-in tasks)

__all__ = [
    "Grade", "GradeContext", "HFSource", "Task", "TaskError", "TaskItem", "get_task", "register_task",
    "sample_items", "task_names",
]
