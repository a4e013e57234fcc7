"""The table store interface: :class:`TableStore`, the protocol every table store implements, and the
records its calls return: :class:`CandidateStats` (accuracy; joules (J) and latency (seconds) per
candidate) and :class:`WriteResult` (rows written).

:class:`~.store.SQLStore` implements it; :mod:`.store` re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from litellm_energy_router.table.rows import Candidate, Query, Run


@dataclass(frozen=True)
class CandidateStats:
    """Per-candidate summary: accuracy over labelled rows; mean, median and 95th percentile of joules (J)
    and of latency (seconds)."""

    candidate: str
    task: str | None
    rows: int
    labelled: int
    accuracy: float | None
    mean_energy_j: float | None
    mean_latency_s: float | None
    router_version: str | None = None  # with ``by_version``: the router version that served the runs
    median_energy_j: float | None = None
    p95_energy_j: float | None = None
    median_latency_s: float | None = None
    p95_latency_s: float | None = None


@dataclass(frozen=True)
class WriteResult:
    """Rows written; with ``keep_first``: rows moved to a fresh call id ``(given, fresh)``, replays skipped."""

    queries: int
    runs: int
    reassigned: tuple[tuple[str, str], ...] = ()
    skipped: int = 0


@runtime_checkable
class TableStore(Protocol):
    """The tournament table. Implementations must make :meth:`write` atomic and idempotent."""

    url: str

    def add_candidates(self, candidates: Iterable[Candidate | dict[str, Any]]) -> int: ...

    def write(
        self,
        queries: Iterable[Query | dict[str, Any]] = (),
        runs: Iterable[Run | dict[str, Any]] = (),
        candidates: Iterable[Candidate | dict[str, Any]] = (),
        *,
        keep_first: bool = False,
        ledger: Sequence[dict[str, Any] | None] | None = None,
    ) -> WriteResult: ...

    def write_batches(
        self, batches: Callable[[], Iterable[tuple[list[Candidate], list[Query], list[Run]]]], *, keep_stored: bool
    ) -> WriteResult: ...

    def candidates(self) -> list[Candidate]: ...

    def iter_runs(
        self, *, since_id: int | None = None, sources: Sequence[str] | None = None
    ) -> Iterator[dict[str, Any]]: ...

    def stats(
        self, *, by_task: bool = False, sources: Sequence[str] | None = None, by_version: bool = False
    ) -> list[CandidateStats]: ...

    def count_runs(self) -> int: ...

    def count_labelled(
        self,
        *,
        since_id: int | None = None,
        since_updated: float | None = None,
        sources: Sequence[str] | None = None,
        seen: Mapping[int, float] | None = None,
    ) -> int: ...

    def runs_for_call(self, call_id: str) -> list[Run]: ...

    def close(self) -> None: ...
