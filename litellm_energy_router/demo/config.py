"""What the demo runs with: its defaults, :class:`DemoConfig` (checked options, workdir paths) and
:class:`DemoError`, the one-line refusal every step of the demo raises."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

Out = Callable[[str], None]

DEFAULT_LAMBDA = (
    0.22  # accuracy per 100 J; mid-curve on the bundled rows: most of the accuracy for a fraction of the joules
)
DEFAULT_EPSILON = 0.05  # exploration rate of the served traffic (every production row gets a propensity)
DEFAULT_CONCURRENCY = 8  # requests in flight
ENERGY_NOTE = (
    "ESTIMATED joules: bundled ML.ENERGY H100 profile (J/prompt token, J/output token) x cl100k token "
    "counts of the replayed answers (energy_method=estimate); nothing here is measured on a GPU"
)
MARKER = "demo.json"


class DemoError(ValueError):
    """The demo cannot run as asked; one line naming the path or option."""


@dataclass
class DemoConfig:
    """What ``energy-router demo`` runs.

    Attributes:
        db: table URL (the demo's own table: it must be empty or left by an earlier demo run).
        workdir: checkpoints, pointer, retrain reports, ``pareto.png``, ``summary.json``.
        quick: tiny training (``TrainConfig.quick()``) and ``quick_queries`` served queries.
        full_training: the long training: the default ``TrainConfig()`` (4 SFT epochs) and a retrain from
            scratch, instead of :data:`~litellm_energy_router.demo.loop.DEMO_SFT_EPOCHS` epochs and a
            warm-started retrain.
        lam: λ of the served traffic (energy weight; ``None`` = :data:`DEFAULT_LAMBDA`).
        epsilon: exploration rate of the strategy (so every production row has a propensity).
        concurrency: requests in flight.
        holdout_fraction: share of the bundled queries held back from the table and served instead.
        shadow_fraction: share of served queries that also get replayed shadow rows for every candidate.
        quick_queries: served queries in quick mode.
        quick_import_fraction: share of the not-held-back queries imported in quick mode (stable hash).
    """

    db: str = "sqlite:///energy_router_demo.db"
    workdir: Path = Path("energy_router_demo")
    quick: bool = False
    full_training: bool = False
    lam: float | None = None
    epsilon: float = DEFAULT_EPSILON
    concurrency: int = DEFAULT_CONCURRENCY
    holdout_fraction: float = 0.2
    shadow_fraction: float = 1.0
    quick_queries: int = 100
    quick_import_fraction: float = 0.25

    @property
    def lam_value(self) -> float:
        return DEFAULT_LAMBDA if self.lam is None else float(self.lam)

    def check(self) -> None:
        if not self.db.startswith(("sqlite:", "postgresql")):
            raise DemoError(f"--db {self.db!r}: must start with sqlite:/// or postgresql")
        if self.lam is not None and not (self.lam >= 0 and np.isfinite(self.lam)):
            raise DemoError(f"--lambda {self.lam!r}: must be a number >= 0")
        if not 0 <= self.epsilon <= 1:
            raise DemoError(f"--epsilon {self.epsilon!r}: must be in [0, 1]")
        if self.concurrency < 1:
            raise DemoError(f"--concurrency {self.concurrency!r}: must be >= 1")
        if not 0 <= self.shadow_fraction <= 1:
            raise DemoError(f"shadow_fraction {self.shadow_fraction!r}: must be in [0, 1]")
        if self.quick and self.full_training:
            raise DemoError("--quick and --full-training: choose one")

    @property
    def pointer(self) -> Path:
        return self.workdir / "router.json"

    @property
    def versions(self) -> Path:
        return self.workdir / "versions"
