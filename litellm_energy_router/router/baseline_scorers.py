"""The evaluation's baselines, served from a checkpoint (scorer kinds ``task_prior``, ``knn``, ``logreg``,
``mf``, and ``stacked``, the per-candidate stack of the others that retrain's model selection may promote).

``energy-router train --scorer KIND`` fits the baseline on the table (hyperparameters by inner CV, as
in ``eval``) and writes a checkpoint: ``baseline.npz`` + a manifest whose ``scorer`` is the kind and
whose ``baseline`` entry names the file. The arrays (numpy only, no pickle):

* every kind: ``tasks[T]`` (training task names), ``prior[T, K]`` (per-task accuracy, smoothed) and
  ``prior_any[K]`` (all tasks; used for a task the table has never seen — for every kind when the
  manifest's ``baseline.unknown_task`` is ``prior``, else only inside the kinds that use the prior);
* ``knn``: ``X[N, D]`` the unit-norm MiniLM embeddings of the training query blocks, ``Y[N, K]`` their
  scores, ``k`` and ``shrink`` (pseudo-neighbours at the task prior);
* ``logreg``: ``coef[K, D + T]`` and ``intercept[K]`` per candidate over [embedding, task one-hot], and
  ``const[K]`` (NaN, or the constant P of a candidate whose training labels had one class);
* ``mf``: ``V[K, dim]``, ``W[D, dim]``, ``w[dim]``, ``B[T, K]`` (matrix factorisation, see
  ``training/baselines.py``; its torch forward written in numpy);
* ``stacked``: each base's arrays under ``<base>__<name>`` (``bases[B]`` names them, in column order)
  and ``stack_w[K, B + 1]``: ``P_k = sigmoid(stack_w[k, :B] · logit(clip(P_base_k)) + stack_w[k, B])``
  (a logistic regression per candidate on the bases' out-of-fold logits, ``training/selection.py``).

The prediction functions below are the ones the training-side baselines use, so a served baseline
gives exactly the P that ``eval`` measured. ``knn``/``logreg`` embed the query (MiniLM: torch and
transformers, imported when such a checkpoint is loaded, never for the others).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from litellm_energy_router.router.checkpoint import CheckpointError, Manifest, part_path
from litellm_energy_router.router.scoring import CheckpointScorer

BASELINE_FILE = "baseline.npz"
EMBEDDING_KINDS = ("knn", "logreg", "mf")
# the array formats this module serves (kind -> arrays beyond the prior); the scorer names are the registry's
NEED = {
    "task_prior": (),
    "knn": ("X", "Y", "k", "shrink"),
    "logreg": ("coef", "intercept", "const"),
    "mf": ("V", "W", "w", "B"),
    "stacked": ("bases", "stack_w"),
}
STACK_CLIP = 1e-3  # P of a base is clipped to [STACK_CLIP, 1 - STACK_CLIP] before its logit


def prior_lookup(
    known: Sequence[str], prior: np.ndarray, prior_any: np.ndarray, tasks: Sequence[str | None]
) -> np.ndarray:
    """``P[n, K]``: the row of ``prior`` for each task in ``known``, ``prior_any`` for any other task."""
    ix = {t: i for i, t in enumerate(known)}
    rows = [prior[ix[t]] if t in ix else prior_any for t in ((t or "") for t in tasks)]
    return np.stack(rows) if rows else np.zeros((0, len(prior_any)))


def knn_proba(
    Xq: np.ndarray,
    Xtr: np.ndarray,
    Ytr: np.ndarray,
    k: int,
    shrink: float,
    prior: np.ndarray,
    Wtr: np.ndarray | None = None,
) -> np.ndarray:
    """Mean score of the ``k`` most cosine-similar training rows (unit-norm ``X``), shrunk toward
    ``prior[n, K]`` with ``shrink`` pseudo-neighbours. ``Wtr[n, K]`` (training a partial matrix): pair
    weights, 0 where a candidate is unlabelled (``Ytr`` NaN there): each candidate's weighted vote of the
    neighbours labelled for it."""
    k = min(int(k), len(Ytr))
    S = Xq @ Xtr.T
    nn = np.argpartition(-S, k - 1, axis=1)[:, :k]
    if Wtr is None:
        return (Ytr[nn].sum(axis=1) + shrink * prior) / (k + shrink)
    W = Wtr[nn]
    votes, mass = (W * np.nan_to_num(Ytr)[nn]).sum(axis=1), W.sum(axis=1)
    return np.where(mass + shrink > 0, (votes + shrink * prior) / np.maximum(mass + shrink, 1e-12), prior)


def logreg_proba(X: np.ndarray, coef: np.ndarray, intercept: np.ndarray, const: np.ndarray) -> np.ndarray:
    """``sigmoid(X @ coef.T + intercept)`` per candidate; a candidate with a finite ``const`` is that constant."""
    P = 1.0 / (1.0 + np.exp(-(X @ coef.T + intercept)))
    return np.where(np.isfinite(const)[None, :], const[None, :], P)


def mf_proba(
    emb: np.ndarray, onehot: np.ndarray, V: np.ndarray, W: np.ndarray, w: np.ndarray, B: np.ndarray
) -> np.ndarray:
    """``sigmoid(((emb @ W) * w) @ normalize(V).T + onehot @ B)``: the matrix factorisation's forward."""
    v = V / np.maximum(np.linalg.norm(V, axis=1, keepdims=True), 1e-12)
    z = ((emb @ W) * w) @ v.T + onehot @ B
    return 1.0 / (1.0 + np.exp(-z))


def stack_features(Ps: Sequence[np.ndarray]) -> np.ndarray:
    """``[n, K, B + 1]``: the clipped logit of each base's P per candidate, and a constant 1."""
    Z = [np.log(np.clip(P, STACK_CLIP, 1 - STACK_CLIP) / (1 - np.clip(P, STACK_CLIP, 1 - STACK_CLIP))) for P in Ps]
    return np.concatenate([np.stack(Z, axis=2), np.ones(Z[0].shape + (1,))], axis=2)


def stack_proba(Ps: Sequence[np.ndarray], stack_w: np.ndarray) -> np.ndarray:
    """The stacked ``P[n, K]`` from the bases' ``P`` (same order as the columns of ``stack_w``)."""
    z = np.einsum("nkb,kb->nk", stack_features(Ps), stack_w)
    return 1.0 / (1.0 + np.exp(-z))


def kind_proba(
    kind: str, a: dict[str, np.ndarray], emb: np.ndarray | None, onehot: np.ndarray, prior: np.ndarray
) -> np.ndarray:
    """``P[n, K]`` of one exported baseline ``kind`` from its arrays ``a``, the query embeddings ``emb``
    (None for kinds that need none), the task one-hot over the training tasks and the task prior."""
    if kind == "task_prior":
        return prior
    if kind == "knn":
        return knn_proba(emb, a["X"].astype(np.float64), a["Y"], int(a["k"]), float(a["shrink"]), prior)
    if kind == "logreg":
        return logreg_proba(np.hstack([emb, onehot]), a["coef"], a["intercept"], a["const"])
    if kind == "mf":
        return mf_proba(emb, onehot, a["V"], a["W"], a["w"], a["B"])
    if kind == "stacked":
        bases = [str(b) for b in a["bases"]]
        Ps = [
            np.clip(
                kind_proba(
                    b, {k.split("__", 1)[1]: v for k, v in a.items() if k.startswith(b + "__")}, emb, onehot, prior
                ),
                0,
                1,
            )
            for b in bases
        ]
        return stack_proba(Ps, a["stack_w"])
    raise ValueError(f"baseline kind {kind!r}: unknown")


def uses_embeddings(kind: str, a: dict[str, np.ndarray]) -> bool:
    if kind == "stacked":
        return any(str(b) in EMBEDDING_KINDS for b in a["bases"])
    return kind in EMBEDDING_KINDS


def task_onehot(known: Sequence[str], tasks: Sequence[str | None]) -> np.ndarray:
    """``[n, T]`` indicators of ``tasks`` over the ``known`` ones (all zero for an unknown task)."""
    return np.array([[t == s for s in known] for t in tasks], dtype=np.float64).reshape(len(tasks), len(known))


class BaselineScorer(CheckpointScorer):
    """A checkpoint holding an exported baseline (see the module docstring)."""

    def __init__(
        self, path: str | Path, manifest: Manifest | None = None, expect_candidates: Sequence[str] | None = None
    ) -> None:
        super().__init__(path, manifest, expect_candidates)
        entry = self.manifest.baseline or {}
        self.name = str(entry.get("kind", self.manifest.scorer))
        if self.name not in NEED:
            raise CheckpointError(f"{self.path}: baseline kind {self.name!r} is not one of {', '.join(NEED)}")
        f = part_path(self.path, self.manifest, entry.get("file", BASELINE_FILE))
        try:
            with np.load(f, allow_pickle=False) as z:
                self.arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{f}: cannot load the baseline ({str(e).splitlines()[0]})") from None
        self.tasks = [str(t) for t in self.arrays.get("tasks", [])]
        missing = [k for k in ("prior", "prior_any", *NEED[self.name]) if k not in self.arrays]
        if not missing and self.name == "stacked":
            missing = [
                f"{b}__{k}"
                for b in self.arrays["bases"]
                for k in NEED.get(str(b), ("?",))
                if f"{b}__{k}" not in self.arrays
            ]
        if missing:
            raise CheckpointError(f"{f}: array {missing[0]!r} missing for a {self.name} baseline")
        if self.arrays["prior_any"].shape != (len(self.manifest.candidates),):
            raise CheckpointError(
                f"{f}: prior_any has shape {self.arrays['prior_any'].shape}, not ({len(self.manifest.candidates)},)"
            )
        self.encoder = str(entry.get("encoder", "all-MiniLM-L6-v2"))
        self.unknown_task = str(entry.get("unknown_task", "model"))  # "prior": a task never seen gets prior_any
        self.inline = not uses_embeddings(self.name, self.arrays)

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        from litellm_energy_router.router.encoder import get_encoder, query_block

        return get_encoder(self.encoder).embed([query_block(t) for t in texts]).astype(np.float64)

    def score(self, texts: Sequence[str], tasks: Sequence[str | None] | None = None) -> np.ndarray:
        tasks = list(tasks) if tasks is not None else [None] * len(texts)
        a = self.arrays
        prior = prior_lookup(self.tasks, a["prior"], a["prior_any"], tasks)
        known = np.array([(t or "") in self.tasks for t in tasks], dtype=bool)
        if self.unknown_task == "prior" and not known.any():
            return prior  # every row's task unseen: the pooled prior, nothing to embed
        emb = self._embed(texts) if uses_embeddings(self.name, a) else None
        P = np.clip(kind_proba(self.name, a, emb, task_onehot(self.tasks, tasks), prior), 0.0, 1.0)
        return np.where(known[:, None], P, prior) if self.unknown_task == "prior" else P
