"""Distil the LM router into the serving student (:mod:`litellm_energy_router.router.student`).

Targets are the LM's slot logits ``z`` (before calibration) for every training query twice: with its
task tag and with the tag hidden (``unknown``, as production traffic is scored). A ridge regression on
the hashed n-gram features (plus one indicator per task and a bias), solved by conjugate gradients,
gives ``W``; the calibration of the LM then applies to the student's logits unchanged.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy import sparse

from litellm_energy_router.router.length_model import DIM, NGRAMS, TAIL_CHARS
from litellm_energy_router.router.student import Student, ngram_buckets


def _design(
    texts: Sequence[str],
    tasks: Sequence[str | None],
    task_names: list[str],
    dim: int,
    ngrams: Sequence[int],
    tail_chars: int,
) -> sparse.csr_matrix:
    """Rows: n-gram indicators / sqrt(count) | task one-hot | 1."""
    tix = {t: i for i, t in enumerate(task_names)}
    rows, cols, vals = [], [], []
    for r, (text, task) in enumerate(zip(texts, tasks)):
        idx = ngram_buckets(text or "", ngrams, dim, tail_chars)
        rows.append(np.full(len(idx), r))
        cols.append(idx)
        vals.append(np.full(len(idx), 1.0 / np.sqrt(max(len(idx), 1))))
        extra = [dim + len(task_names)] + ([dim + tix[task]] if task in tix else [])
        rows.append(np.full(len(extra), r))
        cols.append(np.array(extra))
        vals.append(np.ones(len(extra)))
    shape = (len(texts), dim + len(task_names) + 1)
    return sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=shape)


def _ridge_cg(X: sparse.csr_matrix, Z: np.ndarray, alpha: float, iters: int, tol: float = 1e-6) -> np.ndarray:
    """``argmin_W ||X W − Z||² + alpha ||W||²`` by conjugate gradients on the normal equations, all K
    columns at once; each step is two sparse products (the n-gram space is too wide for a direct solve,
    and common n-grams make ``X Xᵀ`` costly to form)."""
    XT = X.T.tocsr()
    W = np.zeros((X.shape[1], Z.shape[1]))
    R = XT @ Z  # residual of the normal equations at W = 0
    P, rr = R.copy(), (R * R).sum(axis=0)
    stop = tol * rr
    for _ in range(iters):
        Q = XT @ (X @ P) + alpha * P
        a = rr / np.maximum((P * Q).sum(axis=0), 1e-300)
        W += P * a
        R -= Q * a
        rr_new = (R * R).sum(axis=0)
        if np.all(rr_new <= stop):
            break
        P = R + P * (rr_new / np.maximum(rr, 1e-300))
        rr = rr_new
    return W


def fit_student(
    texts: Sequence[str],
    tasks: Sequence[str],
    z_task: np.ndarray,
    z_any: np.ndarray,
    *,
    dim: int = DIM,
    ngrams: Sequence[int] = NGRAMS,
    tail_chars: int = TAIL_CHARS,
    alpha: float = 1.0,
    iters: int = 200,
) -> Student:
    """Ridge fit of the student on ``z_task`` (task shown) and ``z_any`` (task hidden), both [n, K]. Its features
    default to the length model's n-gram buckets, so serving hashes a request once and sums both models' rows in one
    gather: in 3 folds of ``benchmarks/bench_student.py`` the AIQ of these 4,096 buckets of 3/4-grams of 600
    characters is a tie with 65,536 buckets of 2- to 4-grams of 1,024 (docs/benchmarks.md)."""
    task_names = sorted({str(t) for t in tasks})
    all_texts = list(texts) + list(texts)
    all_tasks: list[str | None] = [str(t) for t in tasks] + [None] * len(texts)
    X = _design(all_texts, all_tasks, task_names, dim, ngrams, tail_chars)
    W = _ridge_cg(X, np.vstack([z_task, z_any]).astype(np.float64), alpha, iters)  # [dim + T + 1, K]
    return Student(W[:dim], W[dim : dim + len(task_names)], W[-1], task_names, ngrams, tail_chars)
