"""The decision rule, shared by serving, `energy-router route` and evaluation (numpy only).

Given per-candidate predicted success ``P[n, K]`` in [0, 1] and estimated energy ``E[n, K]`` (J):

* **λ mode** — choose ``argmax_j P_j − λ · E_j / e_ref``. ``e_ref`` (J) normalises energy so λ is
  unit-free: λ = 0 maximises predicted accuracy; large λ picks the cheapest candidate. Ties go to the
  cheaper candidate.
* **target mode** — choose the cheapest candidate with ``P_j ≥ target``; if none reaches the target,
  the one with the highest ``P_j`` (ties: cheaper).

The knob is applied after prediction, so one set of predictions serves every trade-off.
"""

from __future__ import annotations

import numpy as np


def decide_lambda(P: np.ndarray, E: np.ndarray, lam: float, e_ref: float) -> np.ndarray:
    """Index of the chosen candidate per row for energy weight ``lam`` (unit-free; E and e_ref in J)."""
    P = np.asarray(P, dtype=np.float64)
    E = np.asarray(E, dtype=np.float64)
    util = P - lam * E / float(e_ref)
    # tie-break towards lower energy: subtract a tiny energy-proportional epsilon
    util = util - 1e-9 * E / float(e_ref)
    return np.argmax(util, axis=1)


def decide_target(P: np.ndarray, E: np.ndarray, target: float) -> np.ndarray:
    """Index of the cheapest candidate with predicted success ≥ ``target`` per row (else the best)."""
    P = np.asarray(P, dtype=np.float64)
    E = np.asarray(E, dtype=np.float64)
    ok = P >= target
    cheapest_ok = np.argmin(np.where(ok, E, np.inf), axis=1)
    best = decide_lambda(P, E, 0.0, 1.0)
    return np.where(ok.any(axis=1), cheapest_ok, best)


def lambda_grid(P: np.ndarray, E: np.ndarray, e_ref: float, n: int) -> np.ndarray:
    """``n`` values of λ from 0 to the smallest λ at which every row picks its cheapest candidate,
    spaced so the operating points spread over the whole curve (0 plus geometric steps)."""
    P = np.asarray(P, dtype=np.float64)
    E = np.asarray(E, dtype=np.float64) / float(e_ref)
    cheap = np.argmin(E, axis=1)
    rows = np.arange(len(P))
    dP = P - P[rows, cheap][:, None]
    dE = E - E[rows, cheap][:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        need = np.where(dE > 0, dP / dE, 0.0)  # λ above which candidate j loses to the cheapest
    lam_max = float(np.nanmax(need)) if need.size else 1.0
    lam_max = max(lam_max, 1e-6) * 1.05
    if n <= 1:
        return np.array([0.0])
    lo = lam_max * 1e-3
    return np.concatenate([[0.0], np.geomspace(lo, lam_max, n - 1)])


def knob_sweep(knob: dict, n: int) -> np.ndarray:
    """``n`` λ values over a checkpoint's knob range (``lambda_min`` .. ``lambda_max``): 0, then geometric,
    so the points spread from the most accurate end to the cheapest end."""
    lo, hi = float(knob.get("lambda_min", 0.0)), float(knob["lambda_max"])
    if n <= 1:
        return np.array([lo])
    return np.concatenate([[lo], np.geomspace(max(hi * 1e-3, 1e-9), hi, n - 1)])
