"""The learned baselines' common interface: the :class:`Predictor` protocol (``fit(train) -> self``,
``predict_proba(test) -> P[n, K]``, every candidate's probability of answering each query correctly) and the
abstract :class:`Baseline` behind :mod:`.baselines`' built-in ones: features (unit-norm query embedding
followed by the task one-hot), a hyperparameter grid tuned by inner cross-validation **on the training rows
only** (weighted Brier score of ``P`` against the scores, over the labelled pairs), then the refit on all
training rows. :mod:`.baselines` re-exports both names.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from litellm_energy_router.router.baseline_scorers import task_onehot

from .data import TableMatrix, kfold, near_duplicate_groups
from .embed import Embedder, embed_queries
from .pairs import weighted_brier


@runtime_checkable
class Predictor(Protocol):
    """Anything that learns per-candidate success probabilities from a :class:`TableMatrix`."""

    def fit(self, train: TableMatrix) -> "Predictor": ...

    def predict_proba(self, test: TableMatrix) -> np.ndarray: ...


class Baseline(ABC):
    """A baseline with an optional hyperparameter ``grid`` tuned by inner CV on the training rows.

    Pass a hyperparameter explicitly to fix it (it is then not tuned).
    """

    name: ClassVar[str] = "baseline"
    grid: ClassVar[dict[str, list[Any]]] = {}
    uses_embeddings: ClassVar[bool] = False
    accepts_partial: ClassVar[bool] = True  # fits a partial matrix (NaN = unlabelled, ``W`` pair weights)

    def __init__(
        self,
        *,
        name: str | None = None,
        embedder: Embedder | None = None,
        inner_folds: int = 3,
        seed: int = 0,
        **params: Any,
    ) -> None:
        if name is not None:
            self.name = name  # type: ignore[misc]
        unknown = set(params) - set(self.grid)
        if unknown:
            raise ValueError(
                f"baseline {self.name!r}: unknown hyperparameter {sorted(unknown)[0]!r} (has: {', '.join(self.grid) or 'none'})"
            )
        self.embedder = embedder
        self.inner_folds = inner_folds
        self.seed = seed
        self.fixed = params
        self.params: dict[str, Any] = {}
        self.tuning: list[tuple[dict[str, Any], float]] = []  # (params, inner-CV Brier)

    # features ---------------------------------------------------------------------------------------
    def features(self, m: TableMatrix) -> np.ndarray:
        """Query embedding (unit norm) followed by the task one-hot over the training tasks."""
        X = embed_queries(m.texts, self.embedder).astype(np.float64)
        return np.hstack([X, task_onehot(self._tasks, list(m.tasks))])

    # fit / predict ----------------------------------------------------------------------------------
    def fit(self, train: TableMatrix) -> "Baseline":
        self._tasks = train.task_names()
        X = self.features(train) if self.uses_embeddings else None
        free = {k: v for k, v in self.grid.items() if k not in self.fixed}
        combos = [dict(zip(free, vals)) for vals in itertools.product(*free.values())] if free else [{}]
        if len(combos) > 1 and self.inner_folds >= 2 and train.n >= 2 * self.inner_folds:
            keys = near_duplicate_groups(train.texts, train.ids, train.tasks)
            splits = kfold(keys, self.inner_folds, seed=self.seed + 1, groups=train.tasks)
            for combo in combos:
                params = {**self.fixed, **combo}
                P = np.empty_like(train.Y)
                for tr, te in splits:
                    self._fit(train.subset(tr), None if X is None else X[tr], **params)
                    P[te] = self._predict(train.subset(te), None if X is None else X[te])
                self.tuning.append((params, weighted_brier(P, train)))
            self.params = min(self.tuning, key=lambda t: t[1])[0]
        else:
            self.params = {**self.fixed, **combos[0]}
        self._fit(train, X, **self.params)
        return self

    def predict_proba(self, test: TableMatrix) -> np.ndarray:
        X = self.features(test) if self.uses_embeddings else None
        return np.clip(self._predict(test, X), 0.0, 1.0)

    def export_arrays(self) -> dict[str, np.ndarray]:
        """The fitted parameters as the arrays :mod:`~litellm_energy_router.router.baseline_scorers` serves
        (beyond the task prior, which :func:`~.baselines.export_baseline` adds)."""
        return {}

    @abstractmethod
    def _fit(self, train: TableMatrix, X: np.ndarray | None, **params: Any) -> None: ...

    @abstractmethod
    def _predict(self, test: TableMatrix, X: np.ndarray | None) -> np.ndarray: ...
