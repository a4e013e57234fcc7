"""Fitting the cross-task output-length model (:mod:`litellm_energy_router.router.length_model`).

Per candidate, ridge regression of ``log1p(output tokens)`` on the request's features, on every task of the
table at once (rows whose output tokens every candidate recorded; at most :data:`MAX_ROWS`, a random sample
beyond). The intercept is the mean, unpenalised; the damping is chosen among ``alphas`` by **leave-task-out**
inner CV (each task in turn predicted by a model of the others; random folds when the table has one task), so
it is chosen for traffic the table does not hold. The residuals of 3 random folds give the predictive interval
and the smearing factor (out-of-task residuals of a table with a few tasks measure the tasks' spread instead). The support threshold is the 2nd percentile (:data:`SUPPORT_QUANTILE`) of the
training rows' similarity to their nearest other row; the model's weight falls to 0 at ``SUPPORT_MARGIN``
below it, unless an informative cue fires that at least ``MIN_CUE_ROWS`` training rows showed. Without output
tokens the model is the prior alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from litellm_energy_router.energy.profile import chat_output_tokens
from litellm_energy_router.router.length_cues import DENSE, INFORMATIVE, MIN_CUE_ROWS, dense_features
from litellm_energy_router.router.length_model import (
    DIM,
    LENGTH_FILE,
    SKETCH,
    SUPPORT_FULL,
    LengthModel,
    buckets,
    sketch,
)

from .data import TableMatrix, kfold

ALPHAS = (0.3, 1.0, 3.0, 10.0, 30.0)
MAX_ROWS, MAX_REF, MIN_ROWS = 4000, 2000, 20
SUPPORT_QUANTILE, SUPPORT_MARGIN = 0.02, 0.1


def _design(texts: Sequence[str | None], prompt_tokens: np.ndarray) -> tuple[Any, list[np.ndarray]]:
    """Sparse ``X[n, DIM + len(DENSE)]`` (n-grams scaled 1/sqrt(count), then the standardised dense features
    are appended by the caller) and each row's bucket ids."""
    from scipy.sparse import csr_matrix

    rows = [buckets(t or "") for t in texts]
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    indices = np.concatenate(rows) if rows else np.zeros(0, dtype=np.intp)
    vals = np.concatenate([np.full(len(r), 1 / np.sqrt(max(len(r), 1))) for r in rows]) if rows else np.zeros(0)
    return csr_matrix((vals, indices, indptr), shape=(len(rows), DIM)), rows


def _ridge(X: np.ndarray, R: np.ndarray, alphas: Sequence[float]) -> dict[float, np.ndarray]:
    """Ridge weights of every column of ``R`` per damping (dual form: one eigendecomposition of ``X Xᵀ``)."""
    s, U = np.linalg.eigh(X @ X.T)  # X dense: rows are capped (MAX_ROWS)
    UR = U.T @ R
    return {a: X.T @ (U @ (UR / (np.maximum(s, 0.0) + a)[:, None])) for a in alphas}


def _groups(tasks: np.ndarray, ids: Sequence[str], seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    names = sorted(set(tasks.tolist()))
    if len(names) >= 2:
        return [(np.flatnonzero(tasks != t), np.flatnonzero(tasks == t)) for t in names]
    return kfold(list(ids), 3, seed=seed)


def cover_order(refs: np.ndarray, stop: float) -> np.ndarray:
    """An order of the unit reference rows for :meth:`.LengthModel.support`'s early stop: greedily, the row whose
    cosine reaches ``stop`` with the most rows not yet so covered, then the rest in their order. The largest
    cosine, and so every support figure, does not depend on the order; a request like the table's finds a row at
    ``stop`` in the first chunks more often."""
    C = (refs @ refs.T) >= stop
    gain, covered, order = C.sum(axis=1).astype(np.int64), np.zeros(len(refs), dtype=bool), []
    while len(order) < len(refs):
        j = int(np.argmax(gain))
        if gain[j] <= 0:
            break
        new = C[j] & ~covered
        covered |= new
        gain -= C[:, new].sum(axis=1)  # C is symmetric: rows newly covered no longer count for anyone
        gain[j] = -1
        order.append(j)
    taken = np.zeros(len(refs), dtype=bool)
    taken[order] = True
    return np.concatenate([np.asarray(order, dtype=np.intp), np.flatnonzero(~taken)])


def _support(refs: np.ndarray, seed: int) -> tuple[float, float]:
    """(support_lo, support_hi): the 2nd percentile of each reference row's nearest-other-row cosine, less a margin."""
    S = refs @ refs.T
    np.fill_diagonal(S, -np.inf)
    hi = float(np.quantile(S.max(axis=1), SUPPORT_QUANTILE)) if len(refs) > 1 else 1.0
    return hi - SUPPORT_MARGIN, hi


def fit_length_model(
    m: TableMatrix, profile: Any = None, *, alphas: Sequence[float] = ALPHAS, seed: int = 0, max_rows: int = MAX_ROWS
) -> tuple[LengthModel, dict[str, Any]]:
    """Fit on the rows of ``m`` (module docstring). Returns the model and its fit report (damping, the
    leave-task-out error of log tokens against the pooled mean's, the support thresholds, the prior)."""
    prior_d, prior_src = chat_output_tokens(list(m.candidates), profile)
    prior = np.array([prior_d[c] for c in m.candidates])
    rows = np.flatnonzero(np.isfinite(m.T).all(axis=1)) if m.n else np.zeros(0, dtype=np.int64)
    info: dict[str, Any] = {"prior": prior_d, "prior_source": prior_src, "rows": int(len(rows))}
    if len(rows) < MIN_ROWS:
        info["model"] = "prior only (too few rows with output tokens)"
        return LengthModel(prior), info
    rng = np.random.default_rng(seed)
    if len(rows) > max_rows:
        rows = np.sort(rng.choice(rows, max_rows, replace=False))
    X, D, d_mu, d_sd, bks = _features(m, rows)
    Y = np.log1p(np.maximum(m.T[rows], 0.0))  # log1p(output tokens)
    ids = [str(i) for i in m.ids[rows]]
    groups = _groups(m.tasks[rows], ids, seed)
    best, lto = _choose_alpha(X, Y, groups, alphas)
    r = _random_fold_residuals(X, Y, ids, best, seed)
    b = Y.mean(axis=0)
    Wf = _ridge(X, Y - b, [best])[best]
    V = Wf[DIM:] / d_sd[:, None]
    b = b - d_mu @ V  # fold the standardisation into the dense weights
    ref_rows = rng.choice(len(rows), min(MAX_REF, len(rows)), replace=False)
    ref = np.stack([sketch(bks[i]) for i in ref_rows])
    lo, hi = _support(ref, seed)
    ref = ref[cover_order(ref, max(hi, SUPPORT_FULL))]
    pooled = np.concatenate([Y[te] - Y[tr].mean(axis=0) for tr, te in groups])
    cues = INFORMATIVE & ((D > 0).sum(axis=0) >= MIN_CUE_ROWS)
    info.update(
        model="ridge on log1p(tokens)",
        alpha=best,
        support=[lo, hi],
        features=DENSE,
        cues_seen=[n for n, on in zip(DENSE, cues) if on],
        lto_rmse_log={c: float(np.sqrt(np.mean(lto[:, k] ** 2))) for k, c in enumerate(m.candidates)},
        lto_rmse_log_pooled_mean={c: float(np.sqrt(np.mean(pooled[:, k] ** 2))) for k, c in enumerate(m.candidates)},
    )
    model = LengthModel(
        prior,
        Wf[:DIM],
        V,
        b,
        np.quantile(r, 0.1, axis=0),
        np.quantile(r, 0.9, axis=0),
        np.mean(np.exp(r), axis=0),
        ref.astype(np.float16),
        (lo, hi),
        cues,
    )
    return model, info


def _features(m: TableMatrix, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list]:
    """``(X, D, d_mu, d_sd, bks)`` of the rows ``rows`` of ``m``: the dense design (n-grams scaled
    1/sqrt(count), then the standardised dense features), the raw dense features ``D``, their mean and sd
    (floored at 1e-6) and each row's bucket ids."""
    texts, pt = [m.texts[i] for i in rows], m.prompt_tokens[rows]
    Xs, bks = _design(texts, pt)
    D = np.stack([dense_features(t or "", float(p)) for t, p in zip(texts, pt)])
    d_mu, d_sd = D.mean(axis=0), np.maximum(D.std(axis=0), 1e-6)
    X = np.hstack([Xs.toarray(), (D - d_mu) / d_sd])
    return X, D, d_mu, d_sd, bks


def _choose_alpha(
    X: np.ndarray, Y: np.ndarray, groups: Sequence[tuple[np.ndarray, np.ndarray]], alphas: Sequence[float]
) -> tuple[float, np.ndarray]:
    """The damping with the least mean squared held-out residual of log tokens over ``groups`` (leave-task-out
    folds), and those residuals ``[n, K]``."""
    res = {a: np.zeros_like(Y) for a in alphas}
    for tr, te in groups:
        mu = Y[tr].mean(axis=0)
        for a, Wa in _ridge(X[tr], Y[tr] - mu, alphas).items():
            res[a][te] = Y[te] - (X[te] @ Wa + mu)
    best = min(alphas, key=lambda a: float(np.mean(res[a] ** 2)))
    return best, res[best]


def _random_fold_residuals(X: np.ndarray, Y: np.ndarray, ids: Sequence[str], alpha: float, seed: int) -> np.ndarray:
    """Held-out residuals ``[n, K]`` of log tokens on 3 random folds, for the interval and the smearing factor
    (a handful of held-out tasks would turn them into the tasks' spread)."""
    r = np.zeros_like(Y)
    for tr, te in kfold(ids, 3, seed=seed):
        mu = Y[tr].mean(axis=0)
        r[te] = Y[te] - (X[te] @ _ridge(X[tr], Y[tr] - mu, [alpha])[alpha] + mu)
    return r


def attach_length_model(m: TableMatrix, out_dir: str | Path, profile: Any = None) -> dict[str, Any]:
    """Fit on ``m`` and save ``length.npz`` into the checkpoint ``out_dir``; returns the manifest entry
    (the caller writes the manifest)."""
    lm, info = fit_length_model(m, profile)
    lm.save(Path(out_dir) / LENGTH_FILE)
    return {"file": LENGTH_FILE, "sketch": SKETCH, "dim": DIM, "fit": info}
