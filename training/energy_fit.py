"""The routing-time energy estimate (:class:`~litellm_energy_router.router.checkpoint.EnergyEstimate`),
fitted on a table's rows: J per prompt / output token by non-negative least squares of energy (J) on
prompt and completion tokens, so Ê is in the units the table measured; measured production joules
first once a candidate has :data:`~.pairs.MIN_MEASURED_RUNS` of them, then every run with joules, then
the energy profile. Expected output tokens: the weighted mean per (task, candidate), the per-candidate
mean for unknown tasks; a run without output tokens counts with those its joules imply.

Beside the readers it fits on (:mod:`.data` for complete matrices, :mod:`.pairs` for every run), which
import nothing from here. numpy only at module level.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from litellm_energy_router.energy.profile import chat_output_tokens
from litellm_energy_router.router.checkpoint import EnergyEstimate

from .data import MatrixError, TableMatrix
from .pairs import MIN_MEASURED_RUNS, SOURCES, PairTable


def _fit_nonneg_2(x1: np.ndarray, x2: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares ``y ≈ a·x1 + b·x2`` with a, b ≥ 0 (no intercept)."""
    X = np.stack([x1, x2], axis=1)
    a, b = np.linalg.lstsq(X, y, rcond=None)[0]
    if a >= 0 and b >= 0:
        return float(a), float(b)
    fits = []
    for j in (0, 1):
        xj = X[:, j]
        c = max(float(xj @ y) / max(float(xj @ xj), 1e-12), 0.0)
        fits.append((float(np.sum((y - c * xj) ** 2)), j, c))
    _, j, c = min(fits)
    return (c, 0.0) if j == 0 else (0.0, c)


def profile_j_per_token(cand: str, profile: Any | None = None) -> tuple[float, float]:
    """(J per prompt token, J per output token) of ``cand`` from ``profile`` (an
    :class:`~litellm_energy_router.energy.profile.EnergyProfile`; ``None``: the bundled one), for a candidate
    whose runs cannot determine them."""
    if profile is None:
        from litellm_energy_router.energy.profile import load_profile

        profile = load_profile()
    models = getattr(profile, "models", {}) or {}
    if cand not in models:
        raise MatrixError(f"candidate {cand!r}: its runs cannot determine J/token and the energy profile lacks it")
    return float(models[cand].j_per_prompt_token), float(models[cand].j_per_output_token)


def fit_energy_estimate(m: TableMatrix, profile: Any | None = None, pairs: Any | None = None) -> EnergyEstimate:
    """Fit the routing-time energy estimate on the rows of ``m`` (training rows only).

    With ``pairs`` (a :class:`~.pairs.PairTable`) it is fitted on every run with joules instead, measured
    production joules first (:func:`~.pairs.fit_energy_from_pairs`), and records what it was fitted on.

    J per prompt / output token are fitted to the rows themselves (non-negative least squares of energy,
    J, on prompt and completion tokens), so Ê is in the same units as the energy the table measured; a
    candidate whose rows cannot determine them (fewer than 2 runs with completion tokens, or no growth
    with output) takes them from ``profile`` (an
    :class:`~litellm_energy_router.energy.profile.EnergyProfile`; ``None`` loads the bundled one).
    Expected output tokens are the mean per (task, candidate), with the per-candidate mean for unknown
    tasks; a run without completion tokens counts with the output tokens its energy implies.
    """
    if pairs is not None:
        return fit_energy_from_pairs(pairs, profile)
    n, K = m.Y.shape
    tasks = m.task_names()
    tix = {t: i for i, t in enumerate(tasks)}
    zeros = np.zeros(n * K)
    runs = {
        "c": np.tile(np.arange(K), n),
        "task": np.repeat([tix[t] for t in m.tasks], K).astype(np.float64),
        "pt": np.repeat(m.prompt_tokens, K),
        "ct": m.T.ravel(),
        "e": m.E.ravel(),
        "measured": zeros,
        "src": zeros,
        "w": np.ones(n * K),
    }
    return fit_energy_from_runs(runs, m.candidates, tasks, profile).model_copy(update={"fitted_on": None})


def estimate_energy(est: EnergyEstimate, m: TableMatrix) -> np.ndarray:
    """``Ê[n, K]`` (J) for the rows of ``m``, from what routing knows: prompt tokens and task."""
    return np.asarray(est.estimate(m.candidates, m.prompt_tokens, list(m.tasks)), dtype=np.float64)


def _jpt(runs: dict[str, np.ndarray], rows: np.ndarray) -> tuple[float, float] | None:
    known = rows & np.isfinite(runs["ct"]) & np.isfinite(runs["pt"])
    if known.sum() < 2:
        return None
    a, b = _fit_nonneg_2(runs["pt"][known], runs["ct"][known], runs["e"][known])
    return (a, b) if b > 0 else None


def fit_energy_from_pairs(pairs: PairTable, profile: Any | None = None) -> EnergyEstimate:
    """The routing-time energy estimate fitted on every run with joules (module docstring: measured runs
    win once a candidate has :data:`MIN_MEASURED_RUNS` of them)."""
    return fit_energy_from_runs(pairs.runs, pairs.candidates, pairs.run_tasks, profile)


def fit_energy_from_runs(
    runs: dict[str, np.ndarray], cands: Sequence[str], run_tasks: Sequence[str], profile: Any | None = None
) -> EnergyEstimate:
    """The energy estimate of runs given as columns (:attr:`PairTable.runs`: ``c`` candidate index, ``task``
    index into ``run_tasks``, ``pt``/``ct`` prompt/output tokens (NaN unknown), ``e`` J, ``measured``, ``src``,
    ``w`` weight): J/token by non-negative least squares (measured runs first, then every run, then the
    ``profile``), expected output tokens the weighted mean per (task, candidate) and per candidate, a run
    without output tokens counted with those its joules imply."""
    jp, jo, fitted = {}, {}, {}
    for k, cand in enumerate(cands):
        rows = runs["c"] == k
        meas = rows & (runs["measured"] > 0)
        src = runs["src"][rows].astype(np.int64)
        info: dict[str, Any] = {
            "runs": int(rows.sum()),
            "measured_runs": int(meas.sum()),
            **{f"runs_{s}": int((src == i).sum()) for i, s in enumerate(SOURCES)},
        }
        fit = _jpt(runs, meas) if meas.sum() >= MIN_MEASURED_RUNS else None
        info["j_per_token_from"] = "measured"
        if fit is None:
            fit, info["j_per_token_from"] = _jpt(runs, rows), "table"
        if fit is None:
            fit, info["j_per_token_from"] = profile_j_per_token(cand, profile), "profile"
        jp[cand], jo[cand] = fit
        fitted[cand] = info
    jp_a = np.array([jp[c] for c in cands])
    jo_a = np.array([jo[c] for c in cands])
    ck = runs["c"].astype(np.int64)
    pt = np.nan_to_num(runs["pt"])
    implied = np.maximum(runs["e"] - pt * jp_a[ck], 0.0) / jo_a[ck]
    T = np.where(np.isfinite(runs["ct"]), runs["ct"], implied)
    w, tix = runs["w"], runs["task"].astype(np.int64)

    def wmean(sel: np.ndarray) -> float | None:
        return float(np.sum(w[sel] * T[sel]) / np.sum(w[sel])) if sel.any() and np.sum(w[sel]) > 0 else None

    any_ = {c: wmean(ck == k) for k, c in enumerate(cands)}
    any_ = {c: (v if v is not None else 0.0) for c, v in any_.items()}
    per_task: dict[str, dict[str, float]] = {}
    for ti, task in enumerate(run_tasks):
        vals = {c: wmean((ck == k) & (tix == ti)) for k, c in enumerate(cands)}
        per_task[task] = {c: v for c, v in vals.items() if v is not None}
    prior, prior_source = chat_output_tokens(list(cands), profile)
    return EnergyEstimate(
        j_per_prompt_token=jp,
        j_per_output_token=jo,
        output_tokens=per_task,
        output_tokens_any=any_,
        output_tokens_prior=prior,
        prior_source=prior_source,
        fitted_on=fitted,
    )
