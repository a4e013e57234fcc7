"""The router's scoring head: the probe on sentence embeddings and the calibration of the LM's slot logits.

**Probe** (:func:`fit_probe`): per (task, candidate) an L2 logistic regression on the query's embedding,
fitted on every training query (plus one pooled over tasks for unknown tasks). It carries each task's
prior and the within-task signal the embedding holds.

**Calibration** (fitted on queries the SFT stage did not train on), per candidate j, ``z_j`` =
logit(yes) − logit(no) of slot j:

* with a probe: ``P_j = sigmoid(q_j + a_j * (z_j − mean_task z_j))``: the LM adds its within-task
  deviation on top of the probe's logit ``q_j`` (one slope ``a_j >= 0`` per candidate; the task levels stay the
  probe's, fitted on all training queries, not re-estimated on the few calibration queries);
* without: ``P_j = sigmoid(a_j * z_j + b_{task, j})``, one intercept per known task.

For unknown tasks (production) a separate slope/intercept fitted on logits computed with the task tag
hidden. Logistic regression by Newton's method with a small L2 penalty (numpy).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _logreg(X: np.ndarray, y: np.ndarray, l2: float = 1e-2, iters: int = 50) -> np.ndarray:
    w = np.zeros(X.shape[1])
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(X @ w)))
        g = X.T @ (p - y) + l2 * w
        H = (X * (p * (1 - p))[:, None]).T @ X + l2 * np.eye(X.shape[1])
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w


def _slope_with_offset(x: np.ndarray, offset: np.ndarray, y: np.ndarray, l2: float = 1e-2, iters: int = 50) -> float:
    """``a >= 0`` maximising the penalised likelihood of ``y`` under ``sigmoid(offset + a * x)``. SFT
    trained ``x`` to rise with correctness, so a negative slope is noise of a small calibration set
    (it would turn the LM's signal upside down); the likelihood is concave in ``a``, so the
    constrained optimum is the unconstrained one clipped at 0."""
    a = 0.0
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(offset + a * x)))
        step = (float(np.sum((p - y) * x)) + l2 * a) / (float(np.sum(p * (1 - p) * x * x)) + l2)
        a -= step
        if abs(step) < 1e-10:
            break
    return max(a, 0.0)


def fit_calibration(
    z_task: np.ndarray,
    z_any: np.ndarray,
    Y: np.ndarray,
    tasks: Sequence[str],
    q_task: np.ndarray | None = None,
    q_any: np.ndarray | None = None,
) -> dict:
    """``z_task``/``z_any``: slot logits [n, K] with the task tag shown / hidden; ``Y`` [n, K] in {0, 1};
    ``q_task``/``q_any``: the probe's logits for the same queries (fitted without them), or None."""
    if q_task is not None and q_any is not None:
        return _fit_on_probe(z_task, z_any, Y, tasks, q_task, q_any)
    names = sorted(set(tasks))
    onehot = np.array([[t == n for n in names] for t in tasks], dtype=float)
    k = Y.shape[1]
    a, a_any, b_any = np.zeros(k), np.zeros(k), np.zeros(k)
    b_task = {n: [0.0] * k for n in names}
    for j in range(k):
        w = _logreg(np.column_stack([z_task[:, j], onehot]), Y[:, j])
        a[j] = w[0]
        for i, n in enumerate(names):
            b_task[n][j] = float(w[1 + i])
        w2 = _logreg(np.column_stack([z_any[:, j], np.ones(len(Y))]), Y[:, j])
        a_any[j], b_any[j] = w2
    return {"a": a.tolist(), "b_task": b_task, "a_any": a_any.tolist(), "b_any": b_any.tolist()}


def _fit_on_probe(
    z_task: np.ndarray, z_any: np.ndarray, Y: np.ndarray, tasks: Sequence[str], q_task: np.ndarray, q_any: np.ndarray
) -> dict:
    names = sorted(set(tasks))
    t_arr = np.asarray([str(t) for t in tasks])
    mean_t = {n: z_task[t_arr == n].mean(axis=0) for n in names}
    zc = z_task - np.stack([mean_t[t] for t in t_arr])
    mean_any = z_any.mean(axis=0)
    k = Y.shape[1]
    a = np.array([_slope_with_offset(zc[:, j], q_task[:, j], Y[:, j]) for j in range(k)])
    a_any = np.array([_slope_with_offset(z_any[:, j] - mean_any[j], q_any[:, j], Y[:, j]) for j in range(k)])
    return {
        "a": a.tolist(),
        "b_task": {n: (-a * mean_t[n]).tolist() for n in names},
        "a_any": a_any.tolist(),
        "b_any": (-a_any * mean_any).tolist(),
        "offset": "probe",
    }


def fit_probe(
    emb: np.ndarray,
    Y: np.ndarray,
    tasks: Sequence[str],
    encoder: str,
    C: float = 0.3,
    weights: np.ndarray | None = None,
):
    """The probe head (:class:`~litellm_energy_router.router.probe.Probe`) on embeddings ``emb[n, D]``:
    per (task, candidate) and pooled over tasks, an L2 logistic regression with inverse strength ``C``
    (a constant label gives zero weights and a clipped log-odds bias).

    ``weights[n, K]`` (partial feedback, :mod:`.pairs`): each (query, candidate) pair's sample weight,
    0 where the candidate is unlabelled (``Y`` may be NaN there); a (task, candidate) without labelled
    rows takes the pooled regression."""
    from sklearn.linear_model import LogisticRegression

    from litellm_energy_router.router.probe import Probe

    names = sorted({str(t) for t in tasks})
    t_arr = np.asarray([str(t) for t in tasks])
    n, d = emb.shape
    k = Y.shape[1]
    Wt = np.ones((n, k)) if weights is None else np.where(np.isfinite(Y), weights, 0.0)

    def one(rows: np.ndarray, j: int) -> tuple[np.ndarray, float] | None:
        rows = rows & (Wt[:, j] > 0)
        if not rows.any():
            return None
        y, w = (np.nan_to_num(Y[rows, j]) >= 0.5).astype(int), Wt[rows, j]
        if y.min() == y.max():
            p = min(max(float(np.average(y, weights=w)), 1e-3), 1 - 1e-3)
            return np.zeros(d), float(np.log(p / (1 - p)))
        clf = LogisticRegression(C=C, max_iter=3000).fit(emb[rows], y, sample_weight=None if weights is None else w)
        return clf.coef_[0], float(clf.intercept_[0])

    W_any, b_any = np.zeros((k, d)), np.zeros(k)
    for j in range(k):
        W_any[j], b_any[j] = one(np.ones(n, dtype=bool), j) or (np.zeros(d), 0.0)
    W, b = np.zeros((len(names), k, d)), np.zeros((len(names), k))
    for i, name in enumerate(names):
        for j in range(k):
            W[i, j], b[i, j] = one(t_arr == name, j) or (W_any[j], b_any[j])
    return Probe(names, W, b, W_any, b_any, encoder)
