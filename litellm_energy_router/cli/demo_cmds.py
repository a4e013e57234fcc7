"""``energy-router demo``: the main job on embedded defaults, offline (see :mod:`litellm_energy_router.demo`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from litellm_energy_router.cli.common import console, fail
from litellm_energy_router.demo.loop import (
    DEFAULT_CONCURRENCY,
    DEFAULT_EPSILON,
    DEFAULT_LAMBDA,
    DEMO_SFT_EPOCHS,
    DemoConfig,
)

_D = DemoConfig()  # the defaults shown in --help are the code's


def demo(
    db: str = typer.Option(_D.db, "--db", help="the demo's own table (empty, or left by an earlier demo run)"),
    workdir: Path = typer.Option(
        _D.workdir, "--workdir", help="checkpoints, pointer, reports, pareto.png, summary.json"
    ),
    quick: bool = typer.Option(
        False, "--quick", help=f"tiny training and {_D.quick_queries} served queries (about a minute)"
    ),
    full_training: bool = typer.Option(
        False,
        "--full-training",
        help=f"the long training: the default TrainConfig (4 SFT "
        f"epochs, not {DEMO_SFT_EPOCHS:g}) and a retrain from scratch (not warm-started)",
    ),
    lam: Optional[float] = typer.Option(
        None,
        "--lambda",
        help=f"energy weight of the served traffic, accuracy per 100 J (default {DEFAULT_LAMBDA:g})",
        show_default=False,
    ),
    epsilon: float = typer.Option(
        DEFAULT_EPSILON, "--epsilon", help="exploration rate of the strategy (logged propensities)"
    ),
    concurrency: int = typer.Option(DEFAULT_CONCURRENCY, "--concurrency", help="requests in flight"),
) -> None:
    """The whole loop, offline: import the bundled RouterBench rows (20% held back) into SQLite, train the
    router, serve the held-back queries through litellm.Router with the energy strategy and callback
    in front of local backends replaying the recorded answers, label the rows, retrain once, and print
    accuracy and ESTIMATED joules of the served traffic against the best single model, the static models'
    hull, always-largest, always-smallest, random and the oracle."""
    from litellm_energy_router.demo.loop import DemoError, run_demo
    from litellm_energy_router.feedback import FeedbackError
    from litellm_energy_router.profiling.routerbench import ImportFormatError
    from litellm_energy_router.router.checkpoint import CheckpointError
    from litellm_energy_router.table import BadRowError, TableError

    cfg = DemoConfig(
        db=db,
        workdir=workdir,
        quick=quick,
        full_training=full_training,
        lam=lam,
        epsilon=epsilon,
        concurrency=concurrency,
    )
    try:
        run_demo(cfg, out=lambda s: console.print(s, markup=False, highlight=False, soft_wrap=True))
    except (DemoError, ImportFormatError, CheckpointError, BadRowError, TableError, FeedbackError) as e:
        fail(str(e))
