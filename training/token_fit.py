"""Fitting the per-query output-token model (:mod:`litellm_energy_router.router.token_model`) and judging
it against the per-task mean the energy estimate uses otherwise.

Per task and candidate: ridge regression (dual form, one eigendecomposition of the Gram matrix for every candidate
and damping; at most :data:`MAX_ROWS` rows, a random sample beyond) of the output tokens minus their training mean on the task on the query's hashed byte n-grams and
log1p(prompt tokens); the damping chosen by inner CV (mean squared error) among ``alphas``, and the
candidate's column set to zero (the per-task mean kept) when no damping beats the per-task mean in the
inner CV. :func:`token_errors` gives the honest comparison on outer folds: mean absolute error of the
output tokens per candidate, per-task mean vs the model, and each fold's held-out offsets for Ê.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from litellm_energy_router.router.token_model import TokenModel

from .data import TableMatrix, kfold

DIM, NGRAMS, TAIL = 2**14, (3, 4), 400
ALPHAS = (0.3, 1.0, 3.0, 10.0, 30.0)
MAX_ROWS = 4000  # the dual solve is cubic in the rows: a random sample beyond this


def _tokens(m: TableMatrix, means: dict[str, np.ndarray], any_: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per-row expected tokens from ``means``, residual target; NaN tokens count as the mean)."""
    base = np.stack([means.get(str(t), any_) for t in m.tasks]) if m.n else np.zeros((0, m.K))
    T = np.where(np.isnan(m.T), base, m.T)
    return base, T - base


def task_means(m: TableMatrix) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Mean output tokens per (task, candidate) and per candidate (NaN ignored; 0 if none known)."""
    col = lambda X: np.nan_to_num(np.nanmean(X, axis=0)) if np.isfinite(X).any() else np.zeros(m.K)  # noqa: E731
    return {t: col(m.T[m.tasks == t]) for t in m.task_names()}, col(m.T)


def _design(tm: TokenModel, texts: Sequence[str | None], prompt_tokens: np.ndarray) -> Any:
    from scipy.sparse import csr_matrix

    rows = tm.rows(texts)
    indptr = np.concatenate([[0], np.cumsum([len(r) + 1 for r in rows])])
    indices = np.concatenate([np.append(r, tm.dim) for r in rows]) if rows else np.zeros(0, dtype=np.intp)
    vals = np.concatenate(
        [np.append(np.full(len(r), 1 / np.sqrt(max(len(r), 1))), np.log1p(p)) for r, p in zip(rows, prompt_tokens)]
    )
    return csr_matrix((vals, indices, indptr), shape=(len(rows), tm.dim + 1))


def _ridge_all(X: Any, R: np.ndarray, alphas: Sequence[float]) -> dict[float, np.ndarray]:
    """Ridge weights ``W[d, K]`` of every column of ``R`` for every damping in ``alphas``, by one
    eigendecomposition of the Gram matrix (dual form: rows are capped by the caller)."""
    G = (X @ X.T).toarray()
    s, U = np.linalg.eigh(G)
    UR = U.T @ R
    return {a: np.asarray(X.T @ (U @ (UR / (np.maximum(s, 0.0) + a)[:, None]))) for a in alphas}


def fit_token_model(
    m: TableMatrix, *, alphas: Sequence[float] = ALPHAS, folds: int = 3, seed: int = 0, max_rows: int = MAX_ROWS
) -> tuple[TokenModel, dict]:
    """Fit on ``m``, one model per task (at most ``max_rows`` rows of it, drawn at random; see the module
    docstring). Returns the model and, per task and candidate, the damping chosen (None: per-task mean kept)
    and the inner-CV mean squared error (tokens²) of both."""
    tasks = m.task_names()
    W = np.zeros((len(tasks), DIM + 1, m.K))
    info: dict[str, Any] = {}
    for ti, t in enumerate(tasks):
        rows = np.flatnonzero(m.tasks == t)
        if len(rows) > max_rows:
            rows = np.sort(np.random.default_rng(seed).choice(rows, max_rows, replace=False))
        W[ti], info[t] = _fit_task(m.subset(rows), alphas, folds, seed)
    return TokenModel(W, tasks, NGRAMS, TAIL), info


def _fit_task(m: TableMatrix, alphas: Sequence[float], folds: int, seed: int) -> tuple[np.ndarray, dict]:
    shell = TokenModel(np.zeros((1, DIM + 1, m.K)), [""], NGRAMS, TAIL)
    W = np.zeros((DIM + 1, m.K))
    info: dict[str, Any] = {c: {"alpha": None} for c in m.candidates}
    known = ~np.isnan(m.T)
    if m.n < 4 * folds or np.nanstd(np.where(known, m.T, np.nan), axis=0).max() < 1.0:
        return W, info  # too few rows, or output lengths (nearly) constant: the mean is the model
    X = _design(shell, m.texts, m.prompt_tokens)
    mean = lambda T: np.nan_to_num(np.nanmean(T, axis=0))  # noqa: E731
    mse = {a: np.zeros(m.K) for a in alphas}
    base = np.zeros(m.K)
    for tr, te in kfold(list(m.ids), folds, seed=seed):
        mu = mean(m.T[tr])  # the inner fold's own mean: the baseline to beat
        Rtr, Rte = np.nan_to_num(m.T[tr] - mu), np.nan_to_num(m.T[te] - mu)
        base += np.sum(Rte**2, axis=0)
        for a, Wa in _ridge_all(X[tr], Rtr, alphas).items():
            mse[a] += np.sum((Rte - X[te] @ Wa) ** 2, axis=0)
    full = _ridge_all(X, np.nan_to_num(m.T - mean(m.T)), alphas)
    for k, c in enumerate(m.candidates):
        best = min(alphas, key=lambda a: mse[a][k])
        keep = bool(mse[best][k] < base[k])
        info[c] = {
            "alpha": best if keep else None,
            "inner_mse_model": float(mse[best][k] / m.n),
            "inner_mse_mean": float(base[k] / m.n),
        }
        if keep:
            W[:, k] = full[best][:, k]
    return W, info


def token_errors(
    m: TableMatrix, splits: Sequence[tuple[np.ndarray, np.ndarray]]
) -> tuple[dict[str, dict[str, float]], np.ndarray]:
    """Outer-CV judgement: per candidate the mean absolute and root-mean-square error (tokens) of the
    per-task mean and of the model's prediction, on rows with known output tokens; and the held-out offsets ``[n, K]``."""
    offsets = np.zeros((m.n, m.K))
    pred_mean, pred_model = np.full((m.n, m.K), np.nan), np.full((m.n, m.K), np.nan)
    for tr, te in splits:
        train, test = m.subset(tr), m.subset(te)
        tm, _ = fit_token_model(train)
        means, any_ = task_means(train)
        base, _ = _tokens(test, means, any_)
        off = tm.offset(test.texts, test.prompt_tokens, list(test.tasks))
        offsets[te] = off
        pred_mean[te], pred_model[te] = base, np.maximum(base + off, 0.0)
    out = {}
    for k, c in enumerate(m.candidates):
        ok = ~np.isnan(m.T[:, k])
        em, eo = pred_mean[ok, k] - m.T[ok, k], pred_model[ok, k] - m.T[ok, k]
        out[c] = {
            "mae_task_mean": float(np.mean(np.abs(em))) if ok.any() else None,
            "mae_model": float(np.mean(np.abs(eo))) if ok.any() else None,
            "rmse_task_mean": float(np.sqrt(np.mean(em**2))) if ok.any() else None,
            "rmse_model": float(np.sqrt(np.mean(eo**2))) if ok.any() else None,
        }
    return out, offsets


def attach_token_model(m: TableMatrix, out_dir: Any, errors: dict | None = None) -> dict | None:
    """Fit on ``m`` and save ``tokens.npz`` into the checkpoint ``out_dir``; returns the manifest entry
    (None when every candidate keeps the per-task mean). The caller rewrites the manifest."""
    from pathlib import Path

    from litellm_energy_router.router.token_model import TOKENS_FILE

    tm, info = fit_token_model(m)
    if not np.any(tm.W):
        return None
    tm.save(Path(out_dir) / TOKENS_FILE)
    return {
        "file": TOKENS_FILE,
        "dim": tm.dim,
        "ngrams": list(tm.ngrams),
        "tail_chars": tm.tail_chars,
        "fit": info,
        "cv_errors": errors,
    }
