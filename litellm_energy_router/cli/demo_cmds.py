"""``energy-router demo``: the main job on embedded defaults, offline (see :mod:`litellm_energy_router.demo`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import console, fail


def demo(
    db: str = typer.Option("sqlite:///energy_router_demo.db", "--db", help="the demo's own table (empty, or left by an earlier demo run)"),
    workdir: Path = typer.Option(Path("energy_router_demo"), "--workdir", help="checkpoints, pointer, reports, pareto.png, summary.json"),
    quick: bool = typer.Option(False, "--quick", help="tiny training and 100 served queries (about a minute)"),
    lam: Optional[float] = typer.Option(None, "--lambda", help="energy weight of the served traffic (default 0.3)"),
    epsilon: float = typer.Option(0.05, "--epsilon", help="exploration rate of the strategy (logged propensities)"),
    concurrency: int = typer.Option(8, "--concurrency", help="requests in flight"),
) -> None:
    """The whole loop, offline: import the bundled RouterBench rows (20% held back) into SQLite, train the
    default router, serve the held-back queries through litellm.Router with the energy strategy and callback
    in front of local backends replaying the recorded answers, label the rows, retrain once, and print
    accuracy and ESTIMATED joules of the served traffic against always-largest, always-smallest and random."""
    from ..demo.loop import DemoConfig, DemoError, run_demo
    from ..feedback import FeedbackError
    from ..profiling.routerbench import ImportFormatError
    from ..router.checkpoint import CheckpointError
    from ..table import BadRowError, TableError

    cfg = DemoConfig(db=db, workdir=workdir, quick=quick, lam=lam, epsilon=epsilon, concurrency=concurrency)
    try:
        run_demo(cfg, out=lambda s: console.print(s, markup=False, highlight=False, soft_wrap=True))
    except (DemoError, ImportFormatError, CheckpointError, BadRowError, TableError, FeedbackError) as e:
        fail(str(e))
