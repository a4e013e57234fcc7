"""How a labelled (query, candidate) pair of :mod:`.pairs` is weighted, undoing the logging router's selection
bias: the row sources (:data:`SOURCES`; :data:`UNBIASED_SOURCES` are chosen independently of the router),
the weighting settings (:class:`PairWeighting`) and the per-row weights (:func:`ips_weights`).
:mod:`.pairs` re-exports these names.

Unbiased rows weigh 1. A production row of candidate j was logged with propensity ``p`` = the router's
probability of choosing j for that request (ε-greedy exploration keeps it > 0), so candidate j's production
rows over-represent the queries the router thought j good at. Weighting each row by ``1/p`` (inverse
propensity) makes a weighted fit estimate the population fit, provided ``p`` is the true probability of the
logged choice. Two choices, each for a reason:

* *clipping* ``1/p`` at ``max_weight`` (default 10,000, i.e. p >= 1e-4): serving explores unevenly (a candidate
  whose energy production has priced well keeps only ``EXPLORE_FLOOR`` = 0.1 of a uniform share,
  :mod:`litellm_energy_router.router.online`), so its explored propensity is ε·0.1/K: with ε >= 0.01 over up to
  10 candidates that is >= 1e-4, never clipped, so the estimate stays unbiased for the exploration the strategy
  logs (a clip at 100 cut ε = 0.1, K = 3 explored rows at 1/p = 206 and put a candidate of true accuracy 0.50 at
  0.67); the clip only bounds what one mis-logged tiny propensity can do. Clipped rows are counted.
* *self-normalisation* per (logging router version, candidate): the weights of each group are scaled
  so that they sum to the group's row count. Ratio estimators (weighted means, a weighted likelihood's
  optimum without penalty) are unchanged by the scale, so the correction stays; what the scale sets is how
  much the production rows weigh against the unbiased rows and the L2 penalty. Raw ``1/p`` would let
  ``n_j`` production rows of candidate j speak for ~N queries (all production traffic), far more
  evidence than they hold; normalised, they count as the ``n_j`` observations they are. Normalising
  each router version separately keeps the correction within each logging policy (self-normalised
  IPS per policy, pooled by row count). Rows without a ``router_version`` form one group.

A production row without a propensity (no logged decision, e.g. a fallback deployment) is kept with
``1/p = 1`` (as a deterministic choice) and counted in ``stats["production_no_propensity"]``.

numpy only at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

UNBIASED_SOURCES = ("tournament", "shadow", "import")
SOURCES = ("tournament", "shadow", "import", "production")


@dataclass
class PairWeighting:
    """How production rows are reweighted (module docstring).

    Attributes:
        max_weight: clip of the inverse propensity ``1/p`` (10,000: propensities below 1e-4 are clipped).
        self_normalise: scale each (router version, candidate) group's weights to sum to its row count.
    """

    max_weight: float = 10_000.0
    self_normalise: bool = True


def ips_weights(
    source: np.ndarray,
    propensity: np.ndarray,
    cand: np.ndarray,
    version: Sequence[Any],
    cfg: PairWeighting | None = None,
) -> tuple[np.ndarray, dict[str, int]]:
    """Per-row weights: 1 for unbiased rows (``source`` codes index :data:`SOURCES`), clipped and
    self-normalised inverse propensity for production rows. Returns (weights, counts)."""
    cfg = cfg or PairWeighting()
    w = np.ones(len(source))
    prod = source == SOURCES.index("production")
    p = np.asarray(propensity, dtype=np.float64)
    missing = prod & ~(p > 0)
    inv = np.where(p > 0, 1.0 / np.where(p > 0, p, 1.0), 1.0)
    clipped = prod & (inv > cfg.max_weight)
    w[prod] = np.minimum(inv[prod], cfg.max_weight)
    if cfg.self_normalise and prod.any():
        keys = np.array([f"{version[i] or ''}\x00{cand[i]}" for i in np.flatnonzero(prod)], dtype=object)
        _, grp = np.unique(keys, return_inverse=True)
        sums = np.bincount(grp, weights=w[prod])
        counts = np.bincount(grp)
        w[prod] = w[prod] * (counts / sums)[grp]
    return w, {"production_no_propensity": int(missing.sum()), "production_clipped": int(clipped.sum())}
