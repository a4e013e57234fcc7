"""``energy-router table ...``."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, List, Optional

import typer
from rich.table import Table

from litellm_energy_router.cli.common import ConfigOpt, DbOpt, console, db_url, fail
from litellm_energy_router.energy.profile import load_profile
from litellm_energy_router.redact import redact_url
from litellm_energy_router.table import SQLStore, open_store

table_app = typer.Typer(help="The tournament table: import, export, statistics.", no_args_is_help=True)


@contextmanager
def _store(url: str, *, create: bool = True) -> Iterator[SQLStore]:
    """The table at ``url``, closed on exit; ``create=False`` (read-only commands) refuses a table that does
    not exist yet instead of creating an empty one. Errors reach the command line's one-line handler."""
    store = open_store(url, create=create)
    try:
        yield store
    finally:
        store.close()


def progress_bar() -> Any:
    """The commands' progress bar on the CLI's console (:func:`litellm_energy_router.training.progress.progress_bar`:
    lines every few seconds where the output is not a terminal)."""
    from litellm_energy_router.training.progress import progress_bar as bar

    return bar(console)


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_stats(
    store: SQLStore, by_task: bool = False, sources: Optional[List[str]] = None, by_version: bool = False
) -> None:
    stats = store.stats(by_task=by_task, sources=sources, by_version=by_version)
    t = Table(title=f"tournament table {store._safe_url()}")
    if by_task:
        t.add_column("task")
    if by_version:
        t.add_column("router version")
    for col in (
        "candidate",
        "rows",
        "labelled",
        "accuracy",
        "mean J",
        "median J",
        "p95 J",
        "mean latency s",
        "median latency s",
        "p95 latency s",
    ):
        t.add_column(col, justify="left" if col == "candidate" else "right")
    for s in stats:
        cells = [
            s.candidate,
            str(s.rows),
            str(s.labelled),
            _fmt(s.accuracy, ".3f"),
            _fmt(s.mean_energy_j, ".2f"),
            _fmt(s.median_energy_j, ".2f"),
            _fmt(s.p95_energy_j, ".2f"),
            _fmt(s.mean_latency_s, ".3f"),
            _fmt(s.median_latency_s, ".3f"),
            _fmt(s.p95_latency_s, ".3f"),
        ]
        t.add_row(*([s.task or ""] if by_task else []), *([s.router_version or "-"] if by_version else []), *cells)
    if not stats:
        console.print("table is empty")
    else:
        console.print(t)


@table_app.command("stats")
def stats(
    db: Optional[str] = DbOpt,
    config: Optional[Path] = ConfigOpt,
    by_task: bool = typer.Option(False, "--by-task", help="one line per (task, candidate)"),
    source: Optional[List[str]] = typer.Option(None, "--source", help="only these sources (repeatable)"),
    by_version: bool = typer.Option(
        False,
        "--by-version",
        help="one line per router version that served the runs (production rows; '-' for the others)",
    ),
) -> None:
    """Per candidate: rows, accuracy, and the mean, median and 95th percentile of joules and latency."""
    from litellm_energy_router.table.rows import SOURCES

    bad = [x for x in source or () if x not in SOURCES]
    if bad:  # "prod" printed "table is empty" with exit 0 on a table with rows
        fail(f"--source {bad[0]!r}: expected one of {'|'.join(SOURCES)}")
    with _store(db_url(db, config), create=False) as store:
        print_stats(store, by_task, source, by_version)


def _import_routerbench(
    url: str, files: List[Path], energy_profile: Optional[Path], models: Optional[List[str]]
) -> None:
    from litellm_energy_router.profiling.routerbench import (
        OPEN_MODELS,
        ImportFormatError,
        check_headers,
        import_routerbench,
    )

    chosen = [m.strip() for spec in (models or []) for m in spec.split(",") if m.strip()] or list(OPEN_MODELS)
    profile = load_profile(energy_profile)
    origin = str(energy_profile or "bundled energy profile")
    for m in chosen:  # before the table is opened: a typo in --models creates no empty database
        profile.get(m, origin=origin)
    try:
        check_headers(files, chosen)  # nor does a file that is not RouterBench's
    except ImportFormatError as e:
        fail(str(e))
    with _store(url) as store, progress_bar() as bar:
        before = store.count_runs()
        task = bar.add_task("importing RouterBench rows", total=None)
        try:
            summary = import_routerbench(
                store,
                files,
                profile,
                chosen,
                profile_origin=origin,
                progress=lambda n: bar.advance(task, n),
            )
        except ImportFormatError as e:  # a UserError too; caught here for an install whose profiling/ predates it
            fail(str(e))
        added = _added(store, before)
    console.print(summary.line(redact_url(url)) + added, highlight=False, soft_wrap=True)


@table_app.command("import-routerbench")
def import_routerbench_cmd(
    files: List[Path] = typer.Argument(
        ..., exists=True, dir_okay=False, help="RouterBench CSV files (.csv or .csv.gz)"
    ),
    db: Optional[str] = DbOpt,
    config: Optional[Path] = ConfigOpt,
    energy_profile: Optional[Path] = typer.Option(
        None,
        "--energy-profile",
        exists=True,
        dir_okay=False,
        help="J/token profile YAML (default: bundled ML.ENERGY H100 profile)",
    ),
    models: Optional[List[str]] = typer.Option(
        None, "--models", help="models to import (repeatable or comma-separated; default: the 6 open-weight models)"
    ),
) -> None:
    """Import RouterBench rows; energy is estimated from the profile (energy_method=estimate)."""
    _import_routerbench(db_url(db, config), files, energy_profile, models)


@table_app.command("import-matrix")
def import_matrix_cmd(
    file: Path = typer.Argument(
        ...,
        exists=True,
        dir_okay=False,
        help="matrix: .jsonl / .csv (documented form) or LLMRouter's train.json (.gz allowed)",
    ),
    db: Optional[str] = DbOpt,
    config: Optional[Path] = ConfigOpt,
    energy_profile: Optional[Path] = typer.Option(
        None,
        "--energy-profile",
        exists=True,
        dir_okay=False,
        help="J/token profile YAML holding every candidate (default: bundled)",
    ),
    model_map: Optional[List[str]] = typer.Option(
        None, "--map", help="model=candidate (repeatable or comma-separated); default: each model is its own candidate"
    ),
    default_task: Optional[str] = typer.Option(
        None, "--default-task", help="LLMRouter: task of a question without one"
    ),
) -> None:
    """Import a (query, task, per-model score) matrix; energy is estimated from the profile (energy_method=estimate)."""
    from litellm_energy_router.profiling.matrix_import import import_matrix, parse_map

    url, mapping = db_url(db, config), parse_map(model_map) or None
    profile = load_profile(energy_profile)
    with _store(url) as store, progress_bar() as bar:
        before = store.count_runs()
        task = bar.add_task("importing the matrix", total=None)
        summary = import_matrix(
            store,
            file,
            profile,
            mapping,
            default_task=default_task,
            profile_origin=str(energy_profile or "bundled energy profile"),
            progress=lambda n: bar.advance(task, n),
        )
        added = _added(store, before)
    console.print(summary.line(redact_url(url)) + added, highlight=False, soft_wrap=True)


def _added(store, before: int) -> str:
    """How many runs an import added to a table that held ``before``: an import is an upsert, so a file imported
    again writes its rows again and adds none (rows another writer added meanwhile count too)."""
    after = store.count_runs()
    return f"; {max(after - before, 0)} new runs (the table holds {after})"


@table_app.command("export")
def export_cmd(
    out: Path = typer.Argument(..., help=".csv or .parquet"),
    db: Optional[str] = DbOpt,
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Export every run with its query and candidate to one CSV or Parquet file."""
    from litellm_energy_router.table.io import export_table

    with _store(db_url(db, config), create=False) as store:
        n = export_table(store, out)
    console.print(f"exported {n} runs to {out}", highlight=False)


@table_app.command("import")
def import_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help=".csv or .parquet written by `table export`"),
    db: Optional[str] = DbOpt,
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Import a file written by `table export` (all-or-nothing, idempotent)."""
    from litellm_energy_router.table.io import import_table

    with _store(db_url(db, config)) as store:
        before = store.count_runs()
        n = import_table(store, file)
        added = _added(store, before)
    console.print(f"imported {n} runs from {file}{added}", highlight=False)
