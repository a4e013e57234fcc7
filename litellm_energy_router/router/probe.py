"""The router's probe head: a linear model per (task, candidate) on the query's sentence embedding.

``q_j = W_task[j] · e + b_task[j]`` (logit of candidate j answering correctly), with ``e`` the
L2-normalised embedding of the query block (:mod:`.encoder`) and one pooled ``W_any``/``b_any`` for
queries whose task is unknown (production traffic). The calibration adds the LM's slot logits on top
(:func:`~litellm_energy_router.router.model.scores_from_logits` with ``offset=q``). Stored as
``probe.npz`` beside the checkpoint; numpy only (the encoder is loaded separately).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

PROBE_FILE = "probe.npz"


class Probe:
    """``W[T, K, D]``, ``b[T, K]`` for the ``tasks`` (in order) and ``W_any[K, D]``, ``b_any[K]``."""

    def __init__(
        self, tasks: Sequence[str], W: np.ndarray, b: np.ndarray, W_any: np.ndarray, b_any: np.ndarray, encoder: str
    ) -> None:
        self.tasks = [str(t) for t in tasks]
        self.W, self.b = np.asarray(W, dtype=np.float64), np.asarray(b, dtype=np.float64)
        self.W_any, self.b_any = np.asarray(W_any, dtype=np.float64), np.asarray(b_any, dtype=np.float64)
        self.encoder = encoder
        self._ix = {t: i for i, t in enumerate(self.tasks)}
        if self.W.shape[:2] != (len(self.tasks), self.W_any.shape[0]) or self.W.shape[2] != self.W_any.shape[1]:
            raise ValueError(
                f"probe: W {self.W.shape} does not match {len(self.tasks)} tasks and W_any {self.W_any.shape}"
            )

    @property
    def n_candidates(self) -> int:
        return int(self.W_any.shape[0])

    @property
    def dim(self) -> int:
        return int(self.W_any.shape[1])

    def logits(self, emb: np.ndarray, tasks: Sequence[str | None]) -> np.ndarray:
        """Probe logits ``[n, K]`` for embeddings ``emb[n, D]``; a task the probe does not know uses ``W_any``."""
        emb = np.asarray(emb, dtype=np.float64)
        if emb.ndim != 2 or emb.shape[1] != self.dim:
            raise ValueError(f"probe: embeddings of shape {emb.shape}, expected [n, {self.dim}]")
        out = emb @ self.W_any.T + self.b_any
        for i, t in enumerate(tasks):
            j = self._ix.get(t or "")
            if j is not None:
                out[i] = self.W[j] @ emb[i] + self.b[j]
        return out

    def save(self, path: str | Path) -> None:
        np.savez(
            path,
            tasks=np.array(self.tasks, dtype=str),
            W=self.W,
            b=self.b,
            W_any=self.W_any,
            b_any=self.b_any,
            encoder=np.array(self.encoder),
        )

    @classmethod
    def load(cls, path: str | Path) -> "Probe":
        with np.load(path, allow_pickle=False) as z:
            return cls(list(z["tasks"]), z["W"], z["b"], z["W_any"], z["b_any"], str(z["encoder"]))
