"""``energy-router tournament`` and ``energy-router shadow-tournament``."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from litellm_energy_router.cli.common import (
    _check_db,
    _check_settings_file,
    console,
    err_console,
    fail,
    settings_or_fail,
)
from litellm_energy_router.redact import redact_url
from litellm_energy_router.settings import ConfigError

TConfigOpt = typer.Option(
    ..., "--config", "-c", exists=True, dir_okay=False, help="tournament YAML (candidates, tasks, energy, judge)"
)
SettingsOpt = typer.Option(
    None,
    "--settings",
    exists=True,
    dir_okay=False,
    callback=_check_settings_file,
    help="settings YAML for defaults (table, privacy, shadow queue)",
)
DbOpt = typer.Option(
    None, "--db", help="table URL (default: the tournament config's table, else the settings')", callback=_check_db
)


class RichProgress:
    """One bar per candidate: done/total, ETA, running accuracy and mean joules."""

    def __init__(self) -> None:
        self.bar = Progress(
            TextColumn("{task.description:<24}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[stats]}"),
            console=console,
        )
        self.ids: dict[str, Any] = {}

    def start(self, candidate: str, total: int, skipped: int) -> None:
        note = f"{skipped} done before" if skipped else ""
        self.ids[candidate] = self.bar.add_task(candidate, total=total, stats=note)

    def update(self, s: Any) -> None:
        acc = "-" if s.accuracy is None else f"{s.accuracy:.3f}"
        mj = "-" if s.mean_energy_j is None else f"{s.mean_energy_j:.1f}"
        self.bar.update(self.ids[s.candidate], completed=s.done, stats=f"acc={acc} mean J={mj} failed={s.failed}")


def _table_url(db: Optional[str], cfg: Any, settings: Optional[Path]) -> str:
    if db:
        return db
    if cfg.table is not None:
        return cfg.table.url
    return settings_or_fail(settings).table.url


def _run(
    cfg: Any, url: str, make_jobs: Any, source: str, driver: Any = None, sequential: Optional[bool] = None
) -> None:
    """Shared by both commands: open the table, run with progress bars, print the summary."""
    from litellm_energy_router.profiling.runner import Tournament
    from litellm_energy_router.profiling.sandbox import SandboxError
    from litellm_energy_router.profiling.tasks import TaskError
    from litellm_energy_router.table import BadRowError, TableError, open_store

    user_errors = (ConfigError, TaskError, SandboxError, TableError, BadRowError)
    try:
        store = open_store(url)
    except (TableError, ValueError) as e:
        fail(str(e))
    tournament = None
    progress = RichProgress()
    try:
        jobs = make_jobs(store)
        if not jobs:
            console.print("nothing to run", highlight=False)
            return
        tournament = Tournament(cfg, store, source=source, progress=progress)

        async def main() -> Any:
            task = asyncio.current_task()
            loop = asyncio.get_running_loop()
            if task is not None:
                loop.add_signal_handler(signal.SIGTERM, task.cancel)
            return await tournament.run(jobs, driver=driver, sequential=sequential)

        with progress.bar:
            summary = asyncio.run(main())
    except user_errors as e:
        fail(str(e))
    except (KeyboardInterrupt, asyncio.CancelledError):
        written = tournament.summary.written if tournament else 0
        err_console.print(
            f"interrupted: {written} pairs written this run; run the same command again to resume", highlight=False
        )
        raise typer.Exit(130)
    finally:
        if tournament is not None:
            tournament.close()
        store.close()
    _print_summary(summary, source, tournament.accountant.method, url)


def _print_summary(summary: Any, source: str, energy_method: str, url: str) -> None:
    """This run's per-candidate table (pairs, failures, accuracy, mean J) and the summary line."""
    t = Table(title=f"{source} results (this run)")
    for col in ("candidate", "pairs", "failed", "already in table", "accuracy", "mean J"):
        t.add_column(col, justify="left" if col == "candidate" else "right")
    for s in summary.candidates.values():
        t.add_row(
            s.candidate,
            str(s.done),
            str(s.failed),
            str(s.skipped),
            "-" if s.accuracy is None else f"{s.accuracy:.3f}",
            "-" if s.mean_energy_j is None else f"{s.mean_energy_j:.2f}",
        )
    console.print(t)
    console.print(
        f"{summary.line()}; energy_method={energy_method} table={redact_url(url)}",
        highlight=False,
        soft_wrap=True,
    )


def _load(config: Path) -> Any:
    from litellm_energy_router.profiling.config import load_tournament_config

    try:
        return load_tournament_config(config)
    except ConfigError as e:
        fail(str(e))


def tournament(config: Path = TConfigOpt, db: Optional[str] = DbOpt, settings: Optional[Path] = SettingsOpt) -> None:
    """Run every task item x every candidate through LiteLLM, grade, and write to the table.

    Resumable: pairs already in the table are skipped. Ctrl-C keeps every finished pair."""
    cfg = _load(config)
    url = _table_url(db, cfg, settings)
    driver = None
    if cfg.mode == "vllm_offline":  # one GPU: models loaded one after another (extra 'gpu')
        from litellm_energy_router.profiling.vllm_offline import OfflineDriver

        driver = OfflineDriver()

    def make_jobs(store: Any) -> Any:
        from litellm_energy_router.profiling.runner import build_jobs

        return build_jobs(cfg)

    _run(cfg, url, make_jobs, "tournament", driver=driver, sequential=True if driver else None)


def shadow_tournament(
    config: Path = TConfigOpt,
    db: Optional[str] = DbOpt,
    settings: Optional[Path] = SettingsOpt,
    queue: Optional[Path] = typer.Option(
        None, "--queue", exists=True, dir_okay=False, help="shadow queue JSONL (default: settings shadow.queue_path)"
    ),
) -> None:
    """Run the production queries queued by shadow sampling against every candidate (judge-graded),
    written with source=shadow under the production query ids."""
    cfg = _load(config)
    if cfg.judge is None:
        fail(f"{config}: a shadow tournament needs a judge deployment ('judge:')")
    st = settings_or_fail(settings)
    url = _table_url(db, cfg, settings)
    qpath = queue or st.shadow.queue_path

    def make_jobs(store: Any) -> Any:
        from litellm_energy_router.profiling.shadow_tournament import (
            QueueError,
            read_queue,
            shadow_jobs,
        )

        try:
            entries = read_queue(qpath)
        except QueueError as e:
            fail(str(e))
        console.print(f"{len(entries)} queued queries in {qpath}", highlight=False)
        from litellm_energy_router.litellm_glue.callback.private_files import query_salt

        salt = query_salt(st.privacy, st.writer.spool_dir, create=False)
        jobs = shadow_jobs(entries, store, st.privacy, cfg.generation.max_tokens, salt=salt)
        ran.update(j.item.key for j in jobs)
        return jobs

    ran: set[str] = set()
    _run(cfg, url, make_jobs, "shadow")  # returns only when the run completed (an error or interrupt exits)
    from litellm_energy_router.litellm_glue.callback.shadow_queue import trim_queue

    taken = trim_queue(qpath, ran)
    if taken:
        console.print(f"{taken} entries run and taken out of {qpath}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("tournament")(tournament)
    app.command("shadow-tournament")(shadow_tournament)
