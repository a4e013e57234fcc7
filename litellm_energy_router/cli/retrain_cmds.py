"""``energy-router retrain``: cron-safe retraining with a promotion gate (:mod:`litellm_energy_router.training.retrain`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from litellm_energy_router.cli.common import (
    _check_db,
    _check_settings_file,
    console,
    fail,
)


def retrain_cmd(
    config: Optional[Path] = typer.Option(
        None,
        "--config",
        "-c",
        exists=True,
        dir_okay=False,
        callback=_check_settings_file,
        help="YAML with `energy_router:` and `retrain:` sections",
    ),
    since: Optional[int] = typer.Option(
        None, "--since", help="count new rows after this run id (overrides the watermark)"
    ),
    db: Optional[str] = typer.Option(None, "--db", help="table URL (overrides the config)", callback=_check_db),
    pointer: Optional[Path] = typer.Option(
        None, "--pointer", help="checkpoint pointer serving watches (overrides the config)"
    ),
    quick: Optional[bool] = typer.Option(
        None,
        "--quick/--full",
        help="a short training (tiny backbone, few steps: about two minutes on 2 cores; smoke runs)",
    ),
    warm_start: Optional[bool] = typer.Option(
        None, "--warm-start/--from-scratch", help="start from the serving weights"
    ),
    min_new_rows: Optional[int] = typer.Option(None, "--min-new-rows", help="labelled rows needed to train"),
) -> None:
    """Train on rows newer than the serving checkpoint's watermark and promote only a better checkpoint.
    Exits 0 when another run holds the lock or when there is nothing new."""
    from litellm_energy_router.router.checkpoint import CheckpointError
    from litellm_energy_router.settings import ConfigError
    from litellm_energy_router.table import TableError
    from litellm_energy_router.training.data import MatrixError
    from litellm_energy_router.training.retrain import load_retrain_config, run_retrain

    try:
        cfg = load_retrain_config(
            config, table_url=db, pointer=pointer, quick=quick, warm_start=warm_start, min_new_rows=min_new_rows
        )
        from litellm_energy_router.cli.table_cmds import progress_bar

        with progress_bar() as bar:  # one bar per stage, with an ETA where the stage knows its total
            res = run_retrain(
                cfg, since=since, log=lambda s: console.print(s, highlight=False, soft_wrap=True), progress=bar
            )
    except (ConfigError, CheckpointError, MatrixError, TableError) as e:
        fail(str(e))
        return
    if res.report_md is not None:
        console.print(f"report: {res.report_md} and {res.report_json}", highlight=False, soft_wrap=True)
