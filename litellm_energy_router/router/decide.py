"""The decision rule (:func:`decide`), the one every entry point calls: serving, `energy-router route`,
off-policy evaluation, evaluation and the demo (numpy only).

Given per-candidate predicted success ``P[n, K]`` in [0, 1] and estimated energy ``E[n, K]`` (J):

* **λ mode** — choose ``argmax_j P_j − λ · E_j / e_ref``: λ is the predicted accuracy (a fraction,
  0–1) worth giving up to save ``e_ref`` joules. Serving fixes ``e_ref`` in the settings
  (``knob.e_ref_j``, default :data:`DEFAULT_E_REF_J` = 100 J), never in a checkpoint, so a λ keeps its
  meaning across retrains: λ = 0.05 pays up to 5 accuracy points to save 100 J per request. λ = 0
  maximises predicted accuracy; large λ picks the cheapest candidate. Ties go to the cheaper candidate.
* **target mode** — choose the cheapest candidate with ``P_j ≥ target``; if none reaches the target,
  the one with the highest ``P_j`` (ties: cheaper).
* **energy budget** — with ``max_energy_j``, candidates whose ``E_j`` exceeds it are not considered
  (when none fits, the cheapest one is chosen); λ or the target then decides among the rest.
* **objective** — ``knob.objective = "carbon"`` with per-candidate carbon factors ``F`` (PUE x grid
  intensity of the cleanest site serving the candidate now, divided by ``carbon.reference_g_per_kwh``):
  λ and the target weigh ``E_j x F_j``, joules at the reference intensity, so λ is the accuracy worth giving
  up to save one *reference gram* (the gCO2e of ``e_ref`` joules at the reference intensity, PUE 1) and
  keeps that meaning at every hour; ``max_energy_j`` still bounds joules. ``"joules"`` (default) ignores F.

The knob (:class:`~litellm_energy_router.knob.Knob`) is applied after prediction, so one set of
predictions serves every trade-off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from litellm_energy_router.knob import Knob

DEFAULT_E_REF_J = 100.0  # J: the energy unit of λ (accuracy given up per 100 J), fixed across checkpoints


def decide(P: np.ndarray, E: np.ndarray, knob: "Knob", carbon: np.ndarray | None = None) -> np.ndarray:
    """Index of the chosen candidate per row of ``P[n, K]`` (in [0, 1]) and ``E[n, K]`` (J) under ``knob``
    (:class:`~litellm_energy_router.knob.Knob`): among the candidates within ``knob.max_energy_j`` (J;
    None: all), the cheapest reaching ``knob.target_accuracy`` when it is set, else
    ``argmax P − knob.lambda_ · C / knob.e_ref_j``, where the cost ``C`` is ``E`` or, with
    ``knob.objective == "carbon"`` and ``carbon`` (factors ``[n, K]`` or ``[K]``, dimensionless) given,
    ``E x carbon``. The one decision rule: serving, ``energy-router route``, off-policy evaluation and
    evaluation all call it."""
    P = np.asarray(P, dtype=np.float64)
    E = np.asarray(E, dtype=np.float64)
    C = E * np.asarray(carbon, dtype=np.float64) if carbon is not None and knob.objective == "carbon" else E
    budget, target = knob.max_energy_j, knob.target_accuracy
    none_fit = None
    if budget is not None:
        over = E > budget
        none_fit = over.all(axis=1)
        P = np.where(over, -np.inf, P)  # an over-budget candidate never wins while another fits
    choice = decide_target(P, C, target) if target is not None else decide_lambda(P, C, knob.lambda_, knob.e_ref_j)
    return choice if none_fit is None or not none_fit.any() else np.where(none_fit, np.argmin(E, axis=1), choice)


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


def lambda_breakpoints(P: np.ndarray, E: np.ndarray, e_ref: float) -> np.ndarray:
    """Every λ > 0 at which some row's choice under :func:`decide_lambda` changes (unit-free, 1-D).

    Per row, raising λ walks the choice down the upper-left hull of the points (E_j, P_j): from the
    most probable candidate to ever cheaper ones, switching where two utilities are equal.
    """
    P = np.asarray(P, dtype=np.float64)
    En = np.asarray(E, dtype=np.float64) / float(e_ref)
    n, K = P.shape
    rows = np.arange(n)
    cur = decide_lambda(P, En, 0.0, 1.0)
    active = np.ones(n, dtype=bool)
    out = []
    for _ in range(K):
        Pc, Ec = P[rows, cur], En[rows, cur]
        with np.errstate(divide="ignore", invalid="ignore"):
            lam = np.where(En < Ec[:, None], (Pc[:, None] - P) / (Ec[:, None] - En), np.inf)
        lam = np.maximum(lam, 0.0)
        nxt_lam = lam.min(axis=1)
        has = active & np.isfinite(nxt_lam)
        if not has.any():
            break
        out.append(nxt_lam[has])
        tie = lam <= nxt_lam[:, None] * (1 + 1e-12)
        nxt = np.argmin(np.where(tie, En, np.inf), axis=1)  # just above a tie the cheaper one wins
        cur = np.where(has, nxt, cur)
        active = has
    bps = np.concatenate(out) if out else np.zeros(0)
    return bps[bps > 0]


def lambda_grid(P: np.ndarray, E: np.ndarray, e_ref: float, n: int) -> np.ndarray:
    """``n`` values of λ (ascending) from 0 (the most accurate end) to a λ at which every row picks its
    cheapest candidate (the cheapest end), spread over the whole curve: the interior values are
    quantiles of the λ at which decisions switch (:func:`lambda_breakpoints`), so each step between
    neighbouring values changes about the same number of decisions."""
    if n <= 1:
        return np.array([0.0])
    bps = lambda_breakpoints(P, E, e_ref)
    if bps.size == 0:  # every row already picks its cheapest candidate at λ = 0
        return np.concatenate([[0.0], np.geomspace(1e-3, 1.0, n - 1)])
    lam_max = float(bps.max()) * 1.05
    if n == 2:
        return np.array([0.0, lam_max])
    inner = np.quantile(bps, np.arange(1, n - 1) / (n - 1))
    return np.concatenate([[0.0], inner, [lam_max]])


def knob_sweep(knob: dict, n: int) -> np.ndarray:
    """``n`` λ values over a checkpoint's knob range (``lambda_min`` .. ``lambda_max``): 0, then geometric,
    so the points spread from the most accurate end to the cheapest end."""
    lo, hi = float(knob.get("lambda_min", 0.0)), float(knob["lambda_max"])
    if n <= 1:
        return np.array([lo])
    return np.concatenate([[lo], np.geomspace(max(hi * 1e-3, 1e-9), hi, n - 1)])
