"""The tournament's records: a :class:`Job` (one query for every candidate), a candidate's
:class:`Generation`, the running :class:`CandidateSummary` / :class:`TournamentSummary` of a run, and the
:class:`ProgressSink` protocol a progress display implements. Used by :mod:`.runner` and its drivers
(:mod:`.vllm_offline`), which re-export them from :mod:`.runner`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from litellm_energy_router.table import Query

from .tasks import Task, TaskItem


@dataclass(frozen=True)
class Job:
    """One query to put to every candidate. ``query`` is the row to upsert with each run (None when
    the query row exists already, e.g. a production query in a shadow tournament); ``context``: the hashed
    context keys every run of it carries (a shadow run: its production query's, ``router/context.py``)."""

    task: Task
    item: TaskItem
    query: Query | None
    max_tokens: int
    call_id: str | None = None
    context: str | None = None


@dataclass
class Generation:
    """One candidate response. Seconds for times; ``energy_j`` only when the driver measured it."""

    text: str = ""
    latency_s: float | None = None
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    energy_j: float | None = None
    energy_method: str | None = None
    energy_window_s: float | None = None  # seconds a meter measured over (average power); None: use latency


@dataclass
class CandidateSummary:
    """Running totals for one candidate (this run only): pairs, accuracy, mean joules."""

    candidate: str
    total: int = 0
    skipped: int = 0
    done: int = 0
    failed: int = 0
    score_sum: float = 0.0
    energy_sum_j: float = 0.0
    energy_n: int = 0

    @property
    def accuracy(self) -> float | None:
        graded = self.done - self.failed
        return self.score_sum / graded if graded else None

    @property
    def mean_energy_j(self) -> float | None:
        return self.energy_sum_j / self.energy_n if self.energy_n else None


@dataclass
class TournamentSummary:
    candidates: dict[str, CandidateSummary] = field(default_factory=dict)
    written: int = 0
    elapsed_s: float = 0.0
    interrupted: bool = False

    @property
    def complete(self) -> bool:
        return not self.interrupted and all(c.done == c.total for c in self.candidates.values())

    def line(self) -> str:
        done = sum(c.done for c in self.candidates.values())
        failed = sum(c.failed for c in self.candidates.values())
        skipped = sum(c.skipped for c in self.candidates.values())
        return (
            f"{done} pairs run ({failed} failed), {skipped} already in the table, {self.written} rows written "
            f"in {self.elapsed_s:.1f} s"
        )


class ProgressSink(Protocol):
    def start(self, candidate: str, total: int, skipped: int) -> None: ...

    def update(self, summary: CandidateSummary) -> None: ...
