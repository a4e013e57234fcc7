"""Calibration of the router's slot logits: the LM's per-query evidence on top of a prior.

Per candidate j, for a query of task t with text length ℓ (``log1p`` of its characters, known at
routing time)::

    P_j = sigmoid(b_{t,j} + c_{t,j} · (ℓ − μ_t) / σ_t  +  a_j · (z_j − m_{t,j}))

* the **prior** part ``b, c`` is fitted on *all* training queries (it does not use the LM, so the SFT
  queries may inform it): per task and candidate, an intercept, and with ``use_length`` a slope on the
  standardised length (otherwise ``c = 0``). Unknown tasks (production traffic) use one pooled fit.
* the **LM** part is the slot logit ``z_j`` centred on its mean over the task's calibration queries, with
  one slope ``a_j`` per candidate fitted with the prior as a fixed offset on queries the SFT stage did
  not train on. Unknown tasks use logits computed with the task tag hidden and their own slope.

Logistic regressions by Newton's method with a small L2 penalty; numpy.
The older form (``a``, ``b_task``, ``a_any``, ``b_any``: Platt scaling with a per-task intercept fitted
on the calibration queries only) is still read by :func:`litellm_energy_router.router.model.scores_from_logits`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from litellm_energy_router.router.model import ANY_TASK, text_length_feature

__all__ = ["fit_calibration", "text_length_feature"]


def _logreg(X: np.ndarray, y: np.ndarray, l2: float = 1e-2, iters: int = 50, offset: np.ndarray | None = None,
            penalty: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """L2-penalised logistic regression of ``y`` on ``X`` (+ fixed ``offset``); ``penalty`` scales
    the L2 term per coefficient (0 = unpenalised)."""
    w = np.zeros(X.shape[1])
    off = np.zeros(len(y)) if offset is None else offset
    pen = l2 * (np.ones(X.shape[1]) if penalty is None else np.asarray(penalty, dtype=float))
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(X @ w + off)))
        g = X.T @ (p - y) + pen * w
        H = (X * (p * (1 - p))[:, None]).T @ X + np.diag(pen) + 1e-9 * np.eye(X.shape[1])
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w


def _fit_prior(Y: np.ndarray, ell: np.ndarray, use_length: bool, l2: float) -> dict:
    """Per-candidate intercept (and length slope) on the rows of one task (or all rows)."""
    mu, sd = float(ell.mean()), float(ell.std()) or 1.0
    x = (ell - mu) / sd if use_length else np.zeros(len(ell))
    b, c = [], []
    for j in range(Y.shape[1]):
        # the (small) L2 penalty also keeps the intercept finite when a candidate always/never succeeds
        w = _logreg(np.column_stack([x, np.ones(len(x))]), Y[:, j], l2=l2)
        c.append(float(w[0]) if use_length else 0.0)
        b.append(float(w[1]))
    return {"mu": mu, "sd": sd, "b": b, "c": c}


def prior_logits(prior: dict, tasks: Sequence[str | None], ell: np.ndarray) -> np.ndarray:
    """``b_{t,j} + c_{t,j}·(ℓ − μ_t)/σ_t`` per row [n, K] (unknown tasks: the pooled fit)."""
    rows = []
    for t, l in zip(tasks, ell):
        p = prior.get(t or ANY_TASK, prior[ANY_TASK])
        x = (l - p["mu"]) / p["sd"]
        rows.append(np.asarray(p["b"]) + np.asarray(p["c"]) * x)
    return np.array(rows).reshape(len(rows), len(prior[ANY_TASK]["b"]))


def _fit_lm_part(z: np.ndarray, Y: np.ndarray, keys: Sequence[str], offset: np.ndarray, l2: float) -> tuple[list[float], dict]:
    names = sorted(set(keys))
    z_mu = {n: z[np.asarray(keys) == n].mean(axis=0).tolist() for n in names}
    zc = z - np.array([z_mu[k] for k in keys]).reshape(z.shape)
    a = [float(_logreg(zc[:, [j]], Y[:, j], l2=l2, offset=offset[:, j])[0]) for j in range(Y.shape[1])]
    return a, z_mu


def fit_calibration(z_task: np.ndarray, z_any: np.ndarray, Y: np.ndarray, tasks: Sequence[str], *,
                    texts: Sequence[str | None], Y_all: np.ndarray, tasks_all: Sequence[str], texts_all: Sequence[str | None],
                    use_length: bool = False, l2: float = 1e-2) -> dict:  # fmt: skip
    """Fit the calibration.

    ``z_task``/``z_any``: slot logits [n, K] of the calibration queries with the task tag shown / hidden;
    ``Y`` [n, K] their outcomes, ``tasks``/``texts`` their tasks and texts. ``Y_all``, ``tasks_all``,
    ``texts_all``: every training query (for the prior part). ``l2``: penalty on the slopes.
    """
    tasks, tasks_all = [str(t) for t in tasks], [str(t) for t in tasks_all]
    ell_all = text_length_feature(texts_all)
    prior = {ANY_TASK: _fit_prior(Y_all, ell_all, use_length, l2)}
    for n in sorted(set(tasks_all)):
        rows = np.array([t == n for t in tasks_all])
        prior[n] = _fit_prior(Y_all[rows], ell_all[rows], use_length, l2)
    ell = text_length_feature(texts)
    a, z_mu = _fit_lm_part(z_task, Y, tasks, prior_logits(prior, tasks, ell), l2)
    a_any, z_mu_any = _fit_lm_part(z_any, Y, [ANY_TASK] * len(Y), prior_logits(prior, [None] * len(Y), ell), l2)
    return {"form": "prior+lm/2", "prior": prior, "a": a, "z_mu": z_mu, "a_any": a_any, "z_mu_any": z_mu_any[ANY_TASK]}
