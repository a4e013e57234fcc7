"""Learned baseline routers: each predicts ``P[n, K]``, every candidate's probability of answering each
query correctly. The decision (λ or accuracy target) is applied afterwards by the shared rule, exactly
as for the LM router, so baselines and router are compared on equal terms.

One interface (:class:`~.baseline_base.Predictor`: ``fit(train) -> self``, ``predict_proba(test) -> P``; it and
the abstract :class:`~.baseline_base.Baseline` live in :mod:`.baseline_base`, re-exported here); the names are the
scorer registry's (:mod:`litellm_energy_router.router.builtin_scorers`, :func:`make_baseline`):

* ``task_prior`` — per-task mean accuracy of each candidate (smoothed toward its overall mean).
* ``knn`` — cosine k-nearest neighbours on query embeddings, shrunk toward the task prior.
* ``logreg`` — per-candidate L2 logistic regression on query embedding + task one-hot (scikit-learn).
* ``mf`` — RouteLLM-style matrix factorisation: ``σ(w·(norm(v_k) ⊙ W x) + b_k)`` over candidate vectors
  ``v_k`` and projected query features ``x`` (PyTorch), trained pointwise on correctness.

Partial feedback: a matrix from :meth:`~.pairs.PairTable.matrix` has NaN in ``Y`` where a candidate is
unlabelled and pair weights ``W`` (inverse propensity for production rows); every baseline fits on the
labelled pairs only, with those weights (task prior: weighted means; kNN: weighted votes of the labelled
neighbours; logreg: sample weights; MF: weighted loss).

Hyperparameters are chosen by inner cross-validation **on the training rows only** (Brier score of
``P`` against the scores; :meth:`~.baseline_base.Baseline.fit`), then the model is refitted on all training rows. Heavy libraries (torch,
scikit-learn, transformers) are imported inside the methods that need them.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from litellm_energy_router.router.baseline_scorers import knn_proba

from .baseline_base import Baseline, Predictor  # noqa: F401 (re-exported)
from .data import TableMatrix, concat_rows, watermark
from .embed import Embedder
from .pairs import label_weights


def baseline_trainer(
    cls_name: str,
    kind: str,
    *,
    embedder: Embedder | None = None,
    seed: int = 0,
    inner_folds: int = 3,
    train_config: Any = None,
    log: Any = None,
    share: Any = None,
    **params: Any,
) -> "Baseline":
    """The ``fit`` of a built-in baseline's registry entry (:mod:`litellm_energy_router.router.builtin_scorers`):
    an unfitted :class:`Baseline` of class ``cls_name`` serving as scorer ``kind``; the selection's context
    beyond ``embedder``/``seed`` (``train_config``, ``log``, ``share``) is not a baseline's; ``params`` are
    hyperparameters (fixed, not tuned)."""
    return globals()[cls_name](name=kind, embedder=embedder, inner_folds=inner_folds, seed=seed, **params)


def trainable(name: str) -> Any:
    """The registry entry (:class:`~litellm_energy_router.plugins.ScorerSpec`) of a trainable scorer kind;
    :class:`ValueError` naming the known ones otherwise."""
    from litellm_energy_router.plugins import scorer_specs

    specs = {n: s for n, s in scorer_specs().items() if s.fit is not None and not s.combines}
    if name not in specs:
        raise ValueError(f"baseline {name!r}: unknown (have: {', '.join(n for n, s in specs.items() if s.baseline)})")
    return specs[name]


def baseline_names() -> list[str]:
    """The registered baselines (scorer kinds with a ``fit`` that the LM router is compared with), in
    registration order."""
    from litellm_energy_router.plugins import scorer_specs

    return [n for n, s in scorer_specs().items() if s.fit is not None and s.baseline and not s.combines]


def make_baseline(name: str, **kw: Any) -> Any:
    """An unfitted predictor of the registered scorer kind ``name`` (``kw``: ``embedder``, ``seed``, hyperparameters)."""
    return trainable(name).fit(**kw)


def brier(P: np.ndarray, Y: np.ndarray) -> float:
    """Mean squared error of predicted success against the scores (lower is better)."""
    return float(np.mean((np.asarray(P) - np.asarray(Y)) ** 2))


def task_prior(train: TableMatrix, tasks: Sequence[str], alpha: float = 1.0) -> np.ndarray:
    """``P[n, K]``: each candidate's training accuracy on the row's task, smoothed toward its overall
    accuracy with ``alpha`` pseudo-rows (unknown task → overall accuracy). A task's rows count by their
    effective number ``(Σw)² / Σw²`` (tournament rows: their number; IPS-weighted production rows: about their
    number, not their weight sum, so one explored row does not outweigh the pseudo-rows)."""
    W = label_weights(train)
    Yw = W * np.nan_to_num(train.Y)
    glob = Yw.sum(axis=0) / np.maximum(W.sum(axis=0), 1e-12)
    table = {}
    for t in train.task_names():
        rows = train.tasks == t
        sw, sw2 = W[rows].sum(axis=0), (W[rows] ** 2).sum(axis=0)
        n_eff = sw**2 / np.maximum(sw2, 1e-12)
        table[t] = (n_eff * Yw[rows].sum(axis=0) / np.maximum(sw, 1e-12) + alpha * glob) / (n_eff + alpha)
    return np.stack([table.get(t, glob) for t in tasks]) if len(tasks) else np.zeros((0, train.K))


PSEUDO_ROWS = (0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 20.0, 30.0, 50.0)  # the grid pseudo_rows_cv chooses from
CV_ROWS = (1, 2, 3, 5, 10, 20, 50)  # rows of a new task a candidate may have


def pseudo_rows_cv(
    train: TableMatrix, grid: Sequence[float] = PSEUDO_ROWS, ns: Sequence[int] = CV_ROWS, reps: int = 50, seed: int = 0
) -> tuple[float, dict[float, float]]:
    """The pseudo-rows ``alpha`` of :func:`task_prior` (and of a context's rows in the context prior), chosen by
    **leave-task-out** CV on ``train``'s labelled rows: each task in turn plays a new one; for each candidate
    ``n`` of its rows (``ns``, ``reps`` draws) are shrunk toward the other tasks' pooled rate,
    ``(n·mean + alpha·parent) / (n + alpha)``, and scored by squared error against the task's rate on all its
    rows. Returns (best alpha, mean squared error per alpha); a table with one task: (1.0, {})."""
    tasks = train.task_names()
    if len(tasks) < 2:
        return 1.0, {}
    W = label_weights(train)
    Yw, a = W * np.nan_to_num(train.Y), np.asarray(grid, dtype=float)
    rng, loss, cnt = np.random.default_rng(seed), np.zeros(len(a)), 0
    for t in tasks:
        rows = train.tasks == t
        parent = Yw[~rows].sum(axis=0) / np.maximum(W[~rows].sum(axis=0), 1e-12)
        for k in range(train.K):
            y = np.nan_to_num(train.Y[rows & (W[:, k] > 0), k])
            for n in (n for n in ns if 2 * n <= len(y)):
                m_n = y[rng.integers(0, len(y), (reps, n))].mean(axis=1)[:, None]
                loss += (((n * m_n + a * parent[k]) / (n + a) - y.mean()) ** 2).mean(axis=0)
                cnt += 1
    if not cnt:
        return 1.0, {}
    mse = {float(x): float(v / cnt) for x, v in zip(a, loss)}
    return min(mse, key=mse.get), mse


class TaskPrior(Baseline):
    """Per-task mean accuracy of each candidate: what knowing only the task buys. ``alpha`` (pseudo-rows of
    the pooled rate): fixed, or None (default) for :func:`pseudo_rows_cv` on the complete rows."""

    grid = {"alpha": [None]}

    def _fit(self, train: TableMatrix, X: np.ndarray | None, **params: Any) -> None:
        self._train = train
        alpha = params.get("alpha")
        if alpha is None:
            full = train if train.W is None else train.subset(np.flatnonzero(np.isfinite(train.Y).all(axis=1)))
            alpha = pseudo_rows_cv(full, seed=self.seed)[0]
        self.alpha = self.params["alpha"] = float(alpha)

    def _predict(self, test: TableMatrix, X: np.ndarray | None) -> np.ndarray:
        return task_prior(self._train, list(test.tasks), self.alpha)


class KNN(Baseline):
    """Mean correctness of the ``k`` most cosine-similar training queries, shrunk toward the task prior
    with ``shrink`` pseudo-neighbours."""

    grid = {"k": [10, 20, 40, 80, 160, 320], "shrink": [0.0, 10.0, 40.0, 160.0]}
    uses_embeddings = True

    def _fit(self, train: TableMatrix, X: np.ndarray | None, **params: Any) -> None:
        d = X.shape[1] - len(self._tasks)
        self._Xtr, self._Ytr, self._train = X[:, :d], train.Y, train
        self._Wtr = None if train.W is None else label_weights(train)
        self.k, self.shrink = int(params["k"]), float(params["shrink"])

    def _predict(self, test: TableMatrix, X: np.ndarray | None) -> np.ndarray:
        d = self._Xtr.shape[1]
        prior = task_prior(self._train, list(test.tasks))
        return knn_proba(X[:, :d], self._Xtr, self._Ytr, self.k, self.shrink, prior, self._Wtr)

    def export_arrays(self) -> dict[str, np.ndarray]:
        keep = np.isfinite(self._Ytr).all(axis=1)  # serving's kNN votes over complete rows only
        return {
            "X": self._Xtr[keep].astype(np.float32),
            "Y": self._Ytr[keep],
            "k": np.array(self.k),
            "shrink": np.array(self.shrink),
        }


class LogReg(Baseline):
    """One L2-regularised logistic regression per candidate on [embedding, task one-hot]; ``C`` is
    scikit-learn's inverse regularisation strength."""

    grid = {"C": [0.03, 0.1, 0.3, 1.0, 3.0, 10.0]}
    uses_embeddings = True

    def _fit(self, train: TableMatrix, X: np.ndarray | None, **params: Any) -> None:
        from sklearn.linear_model import LogisticRegression

        self._models: list[Any] = []
        W = label_weights(train)
        for k in range(train.K):
            rows = W[:, k] > 0
            y = (np.nan_to_num(train.Y[rows, k]) >= 0.5).astype(int)
            if len(y) == 0 or y.min() == y.max():  # one class only (or no label): a constant
                self._models.append(float(y[0]) if len(y) else float(np.nanmean(train.Y)))
                continue
            sw = None if train.W is None else W[rows, k]
            self._models.append(
                LogisticRegression(C=float(params["C"]), max_iter=2000).fit(X[rows], y, sample_weight=sw)
            )

    def _predict(self, test: TableMatrix, X: np.ndarray | None) -> np.ndarray:
        cols = [np.full(test.n, m) if isinstance(m, float) else m.predict_proba(X)[:, 1] for m in self._models]
        return np.stack(cols, axis=1)

    def export_arrays(self) -> dict[str, np.ndarray]:
        d = next((m.coef_.shape[1] for m in self._models if not isinstance(m, float)), 0)
        coef = np.stack([np.zeros(d) if isinstance(m, float) else m.coef_[0] for m in self._models])
        intercept = np.array([0.0 if isinstance(m, float) else float(m.intercept_[0]) for m in self._models])
        const = np.array([m if isinstance(m, float) else np.nan for m in self._models])
        return {"coef": coef, "intercept": intercept, "const": const}


class MatrixFactorization(Baseline):
    """RouteLLM's matrix-factorisation router, pointwise and with task offsets:
    ``logit_k(x) = b[task, k] + w·(v_k/|v_k| ⊙ W e)`` — candidate vectors ``v_k`` (``dim``), a linear
    projection ``W`` of the query embedding ``e``, per-(task, candidate) offsets ``b`` started at the task
    prior's logits. Binary cross-entropy + ``l2``·(|W|² + |V|² + |w|²), Adam, full batch."""

    grid = {"dim": [16, 64], "l2": [3e-4, 1e-3, 3e-3, 1e-2]}
    uses_embeddings = True
    steps = 200
    lr = 1e-2

    def _split(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = len(self._tasks)
        return X[:, : X.shape[1] - t], X[:, X.shape[1] - t :]

    def _fit(self, train: TableMatrix, X: np.ndarray | None, **params: Any) -> None:
        import torch

        g = torch.Generator().manual_seed(self.seed)
        dim, l2 = int(params["dim"]), float(params["l2"])
        emb, onehot = self._split(X)
        K, d, T = train.K, emb.shape[1], onehot.shape[1]
        prior = np.stack([task_prior(train, [t])[0] for t in self._tasks]) if T else np.zeros((0, K))
        V = torch.nn.Parameter(torch.randn(K, dim, generator=g))
        W = torch.nn.Parameter(torch.randn(d, dim, generator=g) * 0.01)
        w = torch.nn.Parameter(torch.randn(dim, generator=g) * 0.01)
        B = torch.nn.Parameter(torch.logit(torch.tensor(prior.clip(0.02, 0.98), dtype=torch.float32)))
        opt = torch.optim.Adam([V, W, w, B], lr=self.lr)
        E_, O_ = torch.tensor(emb, dtype=torch.float32), torch.tensor(onehot, dtype=torch.float32)
        Yt = torch.tensor(np.nan_to_num(train.Y), dtype=torch.float32)
        Wt = torch.tensor(label_weights(train), dtype=torch.float32)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny matrices: extra threads only contend (15x slower on 2 busy cores)
        try:
            for _ in range(self.steps):
                opt.zero_grad()
                loss = (
                    torch.nn.functional.binary_cross_entropy_with_logits(
                        self._logits(E_, O_, V, W, w, B), Yt, weight=Wt, reduction="sum"
                    )
                    / Wt.sum()
                )
                loss = loss + l2 * (W.pow(2).sum() + V.pow(2).sum() + w.pow(2).sum())
                loss.backward()
                opt.step()
        finally:
            torch.set_num_threads(threads)
        self._params = [p.detach() for p in (V, W, w, B)]

    @staticmethod
    def _logits(emb: Any, onehot: Any, V: Any, W: Any, w: Any, B: Any) -> Any:
        import torch

        q = emb @ W  # [n, dim]
        v = torch.nn.functional.normalize(V, dim=-1)  # [K, dim]
        return (q * w) @ v.T + onehot @ B  # [n, K]

    def _predict(self, test: TableMatrix, X: np.ndarray | None) -> np.ndarray:
        import torch

        emb, onehot = self._split(X)
        with torch.no_grad():
            t = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
            return torch.sigmoid(self._logits(t(emb), t(onehot), *self._params)).numpy().astype(np.float64)

    def export_arrays(self) -> dict[str, np.ndarray]:
        return dict(zip(("V", "W", "w", "B"), (p.numpy().astype(np.float64) for p in self._params)))


def export_baseline(
    name: str,
    m: TableMatrix,
    out_dir: Any,
    *,
    embedder: Embedder | None = None,
    seed: int = 0,
    partial: TableMatrix | None = None,
    profile: Any = None,
    **_context: Any,
) -> Any:
    """Fit the registered scorer kind ``name`` (a built-in baseline: hyperparameters by inner CV; or a
    plugin's) on ``m`` (plus ``partial``: queries only partial feedback labels, weighted, for a predictor
    that ``accepts_partial``) and write it as a checkpoint: ``baseline.npz`` with its ``export_arrays()``
    (``profile``: the energy profile for candidates whose rows cannot fit J/token; None = the bundled one)
    and the task prior, the manifest's ``scorer`` = ``name`` (served by the kind's ``load``, e.g.
    :mod:`litellm_energy_router.router.baseline_scorers`). Returns the directory. The generic ``export``
    of the registry (:class:`~litellm_energy_router.plugins.ScorerSpec`)."""
    from .embed import default_embedder

    trainable(name)
    if len(m) < 2:
        raise ValueError(f"only {len(m)} fully labelled queries for candidates {m.candidates}; need >= 2")
    emb = embedder or default_embedder()
    b = make_baseline(name, embedder=emb, seed=seed)
    b = b.fit(concat_rows(m, partial) if getattr(b, "accepts_partial", False) else m)
    uses = getattr(b, "uses_embeddings", False)
    return write_baseline_checkpoint(
        name,
        m,
        out_dir,
        b.export_arrays(),
        dict(getattr(b, "params", {})),
        emb.name if uses else None,
        b.predict_proba(m),
        profile,
    )


def write_baseline_checkpoint(
    kind: str,
    m: TableMatrix,
    out_dir: Any,
    arrays: dict[str, np.ndarray],
    params: dict[str, Any],
    encoder: str | None,
    P: np.ndarray,
    profile: Any = None,
) -> Any:
    """Write a fitted baseline of ``kind`` (its ``arrays`` beyond the task prior, added here; ``P`` its
    predictions on ``m``, for the knob range and the training Brier) as a servable checkpoint."""
    import time
    from pathlib import Path

    from litellm_energy_router.router.baseline_scorers import BASELINE_FILE
    from litellm_energy_router.router.checkpoint import Manifest, library_versions, write_manifest
    from litellm_energy_router.router.decide import DEFAULT_E_REF_J, lambda_grid

    from .energy_fit import fit_energy_estimate
    from .length_fit import attach_length_model

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tasks = m.task_names()
    prior = task_prior(m, tasks, float(params.get("alpha") or 1.0))
    np.savez(out / BASELINE_FILE, tasks=np.array(tasks, dtype=str), prior=prior, prior_any=m.Y.mean(axis=0), **arrays)
    est = fit_energy_estimate(m, profile)
    grid = lambda_grid(P, est.estimate(m.candidates, m.prompt_tokens, m.tasks), DEFAULT_E_REF_J, 2)
    manifest = Manifest(
        version=time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{kind}",
        candidates=m.candidates,
        scorer=kind,
        knob={"lambda_min": 0.0, "lambda_max": float(grid[-1])},
        energy=est,
        baseline={"file": BASELINE_FILE, "kind": kind, "params": params, "encoder": encoder},
        watermark=watermark(m),
        eval={"train_brier": brier(P, m.Y)},
        versions=library_versions(),
        length=attach_length_model(m, out, profile),
    )
    write_manifest(out, manifest)
    return out
