"""Calibration of the router's slot logits (fitted on queries the SFT stage did not train on).

Per candidate j: ``P_j = sigmoid(a_j * z_j + b_{task, j})`` with ``z_j`` = logit(yes) − logit(no) of slot j
and one intercept per known task; for unknown tasks (production) a separate slope/intercept fitted on
logits computed with the task tag hidden. Logistic regression by Newton's method with a small L2 penalty
(numpy). The per-task intercepts carry each task's prior, so the calibrated router is never worse
calibrated than the task prior on the calibration queries.
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


def fit_calibration(z_task: np.ndarray, z_any: np.ndarray, Y: np.ndarray, tasks: Sequence[str]) -> dict:
    """``z_task``/``z_any``: slot logits [n, K] with the task tag shown / hidden; ``Y`` [n, K] in {0, 1}."""
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
