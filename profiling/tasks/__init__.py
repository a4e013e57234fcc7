"""Benchmark tasks: one interface (:class:`Task`); tasks come from plugins (:func:`get_task`, :func:`task_names`).

Built in (:mod:`.builtin_tasks`): ``mmlu``, ``arc_challenge``, ``hellaswag``, ``winogrande`` (multiple choice),
``gsm8k`` (final number), ``mbpp`` (code run in a sandbox), ``mt_bench`` (LLM judge). More through the
``energy_router_tasks`` hook of a plugin (``docs/plugins.md``).
"""

from .base import (
    Grade,
    GradeContext,
    HFSource,
    Task,
    TaskError,
    TaskItem,
    get_task,
    sample_items,
    task_names,
)

__all__ = [
    "Grade",
    "GradeContext",
    "HFSource",
    "Task",
    "TaskError",
    "TaskItem",
    "get_task",
    "sample_items",
    "task_names",
]
