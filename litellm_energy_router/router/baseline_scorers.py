"""The evaluation's baselines, served from a checkpoint (scorer kinds ``task_prior``, ``knn``, ``logreg``).

``energy-router train --scorer KIND`` fits the baseline on the table (hyperparameters by inner CV, as
in ``eval``) and writes a checkpoint: ``baseline.npz`` + a manifest whose ``scorer`` is the kind and
whose ``baseline`` entry names the file. The arrays (numpy only, no pickle):

* every kind: ``tasks[T]`` (training task names), ``prior[T, K]`` (per-task accuracy, smoothed) and
  ``prior_any[K]`` (all tasks; used for a task the table has never seen);
* ``knn``: ``X[N, D]`` the unit-norm MiniLM embeddings of the training query blocks, ``Y[N, K]`` their
  scores, ``k`` and ``shrink`` (pseudo-neighbours at the task prior);
* ``logreg``: ``coef[K, D + T]`` and ``intercept[K]`` per candidate over [embedding, task one-hot], and
  ``const[K]`` (NaN, or the constant P of a candidate whose training labels had one class).

The prediction functions below are the ones the training-side baselines use, so a served baseline
gives exactly the P that ``eval`` measured. ``knn``/``logreg`` embed the query (MiniLM: torch and
transformers, imported when such a checkpoint is loaded, never for the others).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .checkpoint import CheckpointError, Manifest
from .scoring import CheckpointScorer

BASELINE_FILE = "baseline.npz"
BASELINE_KINDS = ("task_prior", "knn", "logreg")


def prior_lookup(known: Sequence[str], prior: np.ndarray, prior_any: np.ndarray, tasks: Sequence[str | None]) -> np.ndarray:
    """``P[n, K]``: the row of ``prior`` for each task in ``known``, ``prior_any`` for any other task."""
    ix = {t: i for i, t in enumerate(known)}
    rows = [prior[ix[t]] if t in ix else prior_any for t in ((t or "") for t in tasks)]
    return np.stack(rows) if rows else np.zeros((0, len(prior_any)))


def knn_proba(Xq: np.ndarray, Xtr: np.ndarray, Ytr: np.ndarray, k: int, shrink: float, prior: np.ndarray) -> np.ndarray:
    """Mean score of the ``k`` most cosine-similar training rows (unit-norm ``X``), shrunk toward
    ``prior[n, K]`` with ``shrink`` pseudo-neighbours."""
    k = min(int(k), len(Ytr))
    S = Xq @ Xtr.T
    nn = np.argpartition(-S, k - 1, axis=1)[:, :k]
    votes = Ytr[nn].sum(axis=1)
    return (votes + shrink * prior) / (k + shrink)


def logreg_proba(X: np.ndarray, coef: np.ndarray, intercept: np.ndarray, const: np.ndarray) -> np.ndarray:
    """``sigmoid(X @ coef.T + intercept)`` per candidate; a candidate with a finite ``const`` is that constant."""
    P = 1.0 / (1.0 + np.exp(-(X @ coef.T + intercept)))
    return np.where(np.isfinite(const)[None, :], const[None, :], P)


def task_onehot(known: Sequence[str], tasks: Sequence[str | None]) -> np.ndarray:
    """``[n, T]`` indicators of ``tasks`` over the ``known`` ones (all zero for an unknown task)."""
    return np.array([[t == s for s in known] for t in tasks], dtype=np.float64).reshape(len(tasks), len(known))


class BaselineScorer(CheckpointScorer):
    """A checkpoint holding an exported baseline (see the module docstring)."""

    def __init__(self, path: str | Path, manifest: Manifest | None = None,
                 expect_candidates: Sequence[str] | None = None) -> None:  # fmt: skip
        super().__init__(path, manifest, expect_candidates)
        entry = self.manifest.baseline or {}
        self.name = str(entry.get("kind", self.manifest.scorer))
        if self.name not in BASELINE_KINDS:
            raise CheckpointError(f"{self.path}: baseline kind {self.name!r} is not one of {', '.join(BASELINE_KINDS)}")
        f = self.path / str(entry.get("file", BASELINE_FILE))
        try:
            with np.load(f, allow_pickle=False) as z:
                self.arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{f}: cannot load the baseline ({str(e).splitlines()[0]})") from None
        self.tasks = [str(t) for t in self.arrays.get("tasks", [])]
        need = {"task_prior": ("prior", "prior_any"), "knn": ("X", "Y", "k", "shrink"), "logreg": ("coef", "intercept", "const")}
        missing = [k for k in ("prior", "prior_any", *need[self.name]) if k not in self.arrays]
        if missing:
            raise CheckpointError(f"{f}: array {missing[0]!r} missing for a {self.name} baseline")
        if self.arrays["prior_any"].shape != (len(self.manifest.candidates),):
            raise CheckpointError(f"{f}: prior_any has shape {self.arrays['prior_any'].shape}, not ({len(self.manifest.candidates)},)")
        self.encoder = str(entry.get("encoder", "all-MiniLM-L6-v2"))
        self.inline = self.name == "task_prior"

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        from .encoder import get_encoder, query_block

        return get_encoder(self.encoder).embed([query_block(t) for t in texts]).astype(np.float64)

    def score(self, texts: Sequence[str], tasks: Sequence[str | None] | None = None) -> np.ndarray:
        tasks = list(tasks) if tasks is not None else [None] * len(texts)
        a = self.arrays
        prior = prior_lookup(self.tasks, a["prior"], a["prior_any"], tasks)
        if self.name == "task_prior":
            return prior
        emb = self._embed(texts)
        if self.name == "knn":
            P = knn_proba(emb, a["X"].astype(np.float64), a["Y"], int(a["k"]), float(a["shrink"]), prior)
        else:
            P = logreg_proba(np.hstack([emb, task_onehot(self.tasks, tasks)]), a["coef"], a["intercept"], a["const"])
        return np.clip(P, 0.0, 1.0)
