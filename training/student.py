"""Distil the LM router into the serving student (:mod:`litellm_energy_router.router.student`).

Targets are the LM's slot logits ``z`` (before calibration) for every training query twice: with its
task tag and with the tag hidden (``unknown``, as production traffic is scored). A ridge regression on
the hashed n-gram features (plus one indicator per task and a bias), solved in its dual form
(``n × n`` kernel; the feature space is larger than the number of rows), gives ``W``; the calibration
of the LM then applies to the student's logits unchanged.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy import sparse

from litellm_energy_router.router.student import Student, ngram_buckets


def _design(texts: Sequence[str], tasks: Sequence[str | None], task_names: list[str], dim: int,
            ngrams: Sequence[int], tail_chars: int) -> sparse.csr_matrix:  # fmt: skip
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


def fit_student(texts: Sequence[str], tasks: Sequence[str], z_task: np.ndarray, z_any: np.ndarray, *,
                dim: int = 1 << 16, ngrams: Sequence[int] = (2, 3, 4), tail_chars: int = 1024,
                alpha: float = 0.05) -> Student:  # fmt: skip
    """Ridge fit of the student on ``z_task`` (task shown) and ``z_any`` (task hidden), both [n, K]."""
    task_names = sorted({str(t) for t in tasks})
    all_texts = list(texts) + list(texts)
    all_tasks: list[str | None] = [str(t) for t in tasks] + [None] * len(texts)
    X = _design(all_texts, all_tasks, task_names, dim, ngrams, tail_chars)
    Z = np.vstack([z_task, z_any]).astype(np.float64)
    G = (X @ X.T).toarray()
    G[np.diag_indices_from(G)] += alpha
    A = np.linalg.solve(G, Z)  # dual coefficients [2n, K]
    W = np.asarray(X.T @ A)  # [dim + T + 1, K]
    return Student(W[:dim], W[dim : dim + len(task_names)], W[-1], task_names, ngrams, tail_chars)
