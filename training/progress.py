"""Stage timings, peak memory and progress bars for ``train`` / ``retrain``.

:class:`Stages` times each stage (wall seconds) and records the process's peak resident memory after it
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``, a high-water mark); with a ``rich.progress.Progress`` it
shows one bar per stage, with a count and ETA where the stage knows its total (rows read, SFT steps,
batches scored) and elapsed time otherwise.
"""

from __future__ import annotations

import resource
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MiB (Linux reports KiB, macOS bytes)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024 * 1024) if sys.platform == "darwin" else r / 1024


def progress_bar() -> Any:
    """The bar ``retrain`` shows: description, bar, done/total, elapsed, ETA (on stderr)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True))  # fmt: skip


class Stages:
    """``with stages.stage("read table", total=n) as tick: ... tick(k)`` — times the stage and, given a
    rich ``progress``, drives its bar (``tick(advance, total=None, description=None)``)."""

    def __init__(self, progress: Any | None = None) -> None:
        self.progress = progress
        self.timings: dict[str, dict[str, float]] = {}

    @contextmanager
    def stage(self, name: str, total: int | None = None) -> Iterator[Callable[..., None]]:
        task = self.progress.add_task(name, total=total) if self.progress is not None else None

        def tick(advance: float = 1, total: int | None = None, completed: float | None = None,
                 description: str | None = None) -> None:  # fmt: skip
            if task is None:
                return
            kw: dict[str, Any] = {"advance": advance} if completed is None else {"completed": completed}
            if total is not None:
                kw["total"] = total
            if description is not None:
                kw["description"] = description
            self.progress.update(task, **kw)

        t0 = time.perf_counter()
        try:
            yield tick
        finally:
            self.timings[name] = {"seconds": round(time.perf_counter() - t0, 2), "peak_rss_mb": round(peak_rss_mb(), 1)}
            if task is not None:
                t = self.progress.tasks[[x.id for x in self.progress.tasks].index(task)]
                self.progress.update(task, total=t.total if t.total is not None else 1,
                                     completed=t.total if t.total is not None else 1)  # fmt: skip

    def report(self) -> dict[str, Any]:
        """``{"stages": {name: {"seconds", "peak_rss_mb"}}, "peak_rss_mb": ...}`` for the retrain report."""
        return {"stages": dict(self.timings), "peak_rss_mb": round(peak_rss_mb(), 1)}


class CountingStore:
    """A table store whose ``iter_runs`` calls ``tick()`` per row read (a progress bar over the read) and
    ``also(row)`` for every row (a second reader fed by the same pass); everything else is the wrapped store's."""

    def __init__(self, store: Any, tick: Callable[..., None], every: int = 1000,
                 also: Callable[[dict[str, Any]], None] | None = None) -> None:  # fmt: skip
        self._store, self._tick, self._every, self._also = store, tick, every, also
        self.rows_read = 0

    def iter_runs(self, **kw: Any) -> Iterator[dict[str, Any]]:
        for r in self._store.iter_runs(**kw):
            if self._also is not None:
                self._also(r)
            self.rows_read += 1
            if self.rows_read % self._every == 0:
                self._tick(self._every)
            yield r
        self._tick(self.rows_read % self._every)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
