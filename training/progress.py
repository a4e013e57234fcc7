"""Stage timings, peak memory, progress bars and progress lines for ``train`` / ``retrain`` / ``demo``.

:class:`Stages` times each stage (wall seconds) and records the process's peak resident memory after it
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``, a high-water mark); with a ``rich.progress.Progress`` it
shows one bar per stage, with a count and ETA where the stage knows its total (rows read, SFT steps,
batches scored) and elapsed time otherwise.

:class:`Heartbeat` keeps a line-printing run (the demo) from falling silent: inside ``with
heartbeat(out):`` the TRL training loops add :func:`trainer_progress_callback` (a line with step, loss and
ETA at most every ``every_s`` seconds of wall time, not every N steps), and a ticker thread prints a
"still working" line whenever nothing was printed for ``every_s`` seconds (probe embeddings, distillation,
the retrain's comparison: stages without steps).
"""

from __future__ import annotations

import resource
import sys
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MiB (Linux reports KiB, macOS bytes)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024 * 1024) if sys.platform == "darwin" else r / 1024


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its waited-for children so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass
class Timings:
    """Wall and CPU seconds of each stage (CPU time shows what a stage costs on a machine shared with other work)."""

    steps: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    _cpu0: float = field(default_factory=cpu_seconds)

    def mark(self, name: str, t0: float) -> float:
        c = cpu_seconds()
        self.steps[name] = round(time.time() - t0, 1)
        self.cpu[name] = round(c - self._cpu0, 1)
        self._cpu0 = c
        return time.time()

    def line(self, wall: float) -> str:
        return (
            f"wall time {wall:.0f}s ("
            + ", ".join(f"{k} {v:.0f}s" for k, v in self.steps.items())
            + f"); CPU {cpu_seconds():.0f}s ("
            + ", ".join(f"{k} {v:.0f}s" for k, v in self.cpu.items())
            + ")"
        )


LOG_EVERY_S = 15.0  # s between progress lines where the output is not a terminal


@contextmanager
def progress_bar(console: Any = None, every_s: float = LOG_EVERY_S) -> Iterator[Any]:
    """The one progress bar of the commands (``train``, ``eval``, ``retrain``, the table imports): description, bar,
    done/total, elapsed, ETA, on ``console`` (default: stderr). Where the console is not a terminal (a log file, cron,
    ``| tee``), rich draws nothing: a line per unfinished task every ``every_s`` seconds instead
    (``SFT: 120/288, 41 s``), so a long job never falls silent."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = console if console is not None else Console(stderr=True)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    with bar:
        if console.is_terminal:
            yield bar
            return

        def lines() -> None:
            for t in bar.tasks:
                if not t.finished:
                    total = f"/{t.total:.0f}" if t.total else ""
                    console.print(f"{t.description}: {t.completed:.0f}{total}, {t.elapsed or 0:.0f} s", markup=False)

        with ticking(lines, every_s, "energy-router-progress"):
            yield bar


@contextmanager
def ticking(fn: Callable[[], Any], every_s: float, name: str) -> Iterator[None]:
    """Call ``fn`` every ``every_s`` seconds on a daemon thread for the block (stopped and joined at its end)."""
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every_s):
            fn()

    t = threading.Thread(target=tick, name=name, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=2 * every_s + 1)


class Stages:
    """``with stages.stage("read table", total=n) as tick: ... tick(k)`` — times the stage and, given a
    rich ``progress``, drives its bar (``tick(advance, total=None, description=None)``)."""

    def __init__(self, progress: Any | None = None) -> None:
        self.progress = progress
        self.timings: dict[str, dict[str, float]] = {}

    @contextmanager
    def stage(self, name: str, total: int | None = None) -> Iterator[Callable[..., None]]:
        task = self.progress.add_task(name, total=total) if self.progress is not None else None

        def tick(
            advance: float = 1, total: int | None = None, completed: float | None = None, description: str | None = None
        ) -> None:
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
                self.progress.update(
                    task, total=t.total if t.total is not None else 1, completed=t.total if t.total is not None else 1
                )

    def report(self) -> dict[str, Any]:
        """``{"stages": {name: {"seconds", "peak_rss_mb"}}, "peak_rss_mb": ...}`` for the retrain report."""
        return {"stages": dict(self.timings), "peak_rss_mb": round(peak_rss_mb(), 1)}


class CountingStore:
    """A table store whose ``iter_runs`` calls ``tick()`` per row read (a progress bar over the read) and
    ``also(row)`` for every row (a second reader fed by the same pass); everything else is the wrapped store's."""

    def __init__(
        self,
        store: Any,
        tick: Callable[..., None],
        every: int = 1000,
        also: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
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


class Heartbeat:
    """Progress lines at least every ``every_s`` seconds (wall, by ``clock``, a monotonic seconds source).

    Every line of the run goes through :meth:`out`, which records when the last line was printed;
    :meth:`beat` prints an informative line once ``every_s`` seconds passed since the last line;
    :meth:`check` (the ticker thread's) prints a "still working" line naming the stage after ``idle_s``
    silent seconds (longer than ``every_s``, so a stage that reports its own progress is not interrupted).
    """

    def __init__(
        self,
        out: Callable[[str], None],
        every_s: float = 3.0,
        idle_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._out, self.every_s, self.idle_s, self.clock = out, float(every_s), float(idle_s), clock
        self.last = self.stage_t0 = clock()
        self.stage = "starting"
        self._lock = threading.Lock()

    def out(self, line: str) -> None:
        with self._lock:
            self._out(line)
            self.last = self.clock()

    def set_stage(self, name: str) -> None:
        """Name the stage the "still working" lines report (and restart its clock)."""
        self.stage, self.stage_t0 = name, self.clock()

    def due(self, after_s: float | None = None) -> bool:
        """True once ``after_s`` (default ``every_s``) seconds passed since the last line."""
        return self.clock() - self.last >= (self.every_s if after_s is None else after_s)

    def beat(self, make_line: Callable[[], str], after_s: float | None = None) -> bool:
        """Print ``make_line()`` if :meth:`due`; True if it printed."""
        if not self.due(after_s):
            return False
        self.out(make_line())
        return True

    def check(self) -> bool:
        """The ticker's call: after ``idle_s`` silent seconds, one line saying which stage is still running."""
        return self.beat(
            lambda: f"      ... {self.stage}: still working ({self.clock() - self.stage_t0:.0f} s in this stage)",
            self.idle_s,
        )


_ACTIVE: ContextVar[Heartbeat | None] = ContextVar("energy_router_heartbeat", default=None)


def active_heartbeat() -> Heartbeat | None:
    """The :class:`Heartbeat` of the enclosing ``with heartbeat(...)`` (None outside one)."""
    return _ACTIVE.get()


@contextmanager
def heartbeat(
    out: Callable[[str], None], every_s: float = 3.0, idle_s: float = 5.0, tick_s: float = 1.0
) -> Iterator[Heartbeat]:
    """A :class:`Heartbeat` over ``out`` for the block, with its ticker thread (checks every ``tick_s`` s)."""
    hb = Heartbeat(out, every_s, idle_s)
    token = _ACTIVE.set(hb)
    try:
        with ticking(hb.check, tick_s, "energy-router-heartbeat"):
            yield hb
    finally:
        _ACTIVE.reset(token)


def step_line(label: str, step: int, max_steps: int, elapsed_s: float, loss: float | None = None) -> str:
    """``SFT step 40/288 (14%), loss 0.612, 12 s, ETA 75 s`` (ETA from the mean step time so far)."""
    pct = f" ({100 * step / max_steps:.0f}%)" if max_steps else ""
    eta = f", ETA {elapsed_s / step * (max_steps - step):.0f} s" if step and max_steps else ""
    loss_s = f", loss {loss:.3f}" if loss is not None else ""
    return f"      {label} step {step}/{max_steps or '?'}{pct}{loss_s}, {elapsed_s:.0f} s{eta}"


def trainer_progress_callback(label: str, hb: Heartbeat) -> Any:
    """A ``transformers.TrainerCallback`` printing :func:`step_line` through ``hb`` at most every
    ``hb.every_s`` seconds of wall time (and once at the first step), whatever a step costs."""
    from transformers import TrainerCallback

    class _TimedProgress(TrainerCallback):
        t0: float = 0.0
        printed: float = 0.0
        loss: float | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = self.printed = hb.clock()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self.loss = float(logs["loss"])

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = hb.clock()  # its own clock: a slow step still gets its line after the ticker's
            if state.global_step == 1 or now - self.printed >= hb.every_s:
                self.printed = now
                hb.out(step_line(label, state.global_step, state.max_steps, now - self.t0, self.loss))

    return _TimedProgress()
