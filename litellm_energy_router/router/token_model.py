"""Per-query output tokens at routing time: per (task, candidate) a linear model over hashed byte n-grams
of the query block's tail (the student's features, :func:`.student.ngram_buckets`) and the log prompt
length, predicting the candidate's output tokens *minus its per-task mean*. The energy estimate adds it
to the per-task mean (:meth:`.checkpoint.EnergyEstimate.estimate`, ``offset_tokens``); a (task, candidate)
whose weights are zero, and every task the model was not fitted for (unseen ones included), keeps the
per-task mean (training zeroes the pairs where the model did not lower the inner-CV error).

``tokens.npz``: ``W[T, dim + 1, K]`` (last row: log1p(prompt tokens)), ``tasks[T]``, ``ngrams``,
``tail_chars``. The manifest's ``tokens`` entry names the file and the CV errors
(``training/token_fit.py``). numpy only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from litellm_energy_router.router.encoder import query_block
from litellm_energy_router.router.student import ngram_buckets, row_sum

TOKENS_FILE = "tokens.npz"


class TokenModel:
    def __init__(self, W: np.ndarray, tasks: Sequence[str], ngrams: Sequence[int], tail_chars: int) -> None:
        self.W = np.asarray(W, dtype=np.float64).reshape(len(tasks), -1, np.shape(W)[-1])
        self.tasks = {str(t): i for i, t in enumerate(tasks)}
        self.ngrams = tuple(int(n) for n in ngrams)
        self.tail_chars = int(tail_chars)
        self.dim = self.W.shape[1] - 1
        if self.dim < 2 or self.dim & (self.dim - 1):
            raise ValueError(f"token model: {self.dim} n-gram buckets is not a power of two")

    @property
    def n_candidates(self) -> int:
        return self.W.shape[2]

    @classmethod
    def load(cls, path: str | Path) -> "TokenModel":
        with np.load(path, allow_pickle=False) as z:
            return cls(z["W"], [str(t) for t in z["tasks"]], z["ngrams"].tolist(), int(z["tail_chars"]))

    def save(self, path: str | Path) -> None:
        np.savez(
            path,
            W=self.W,
            tasks=np.array(list(self.tasks), dtype=str),
            ngrams=np.array(self.ngrams),
            tail_chars=np.array(self.tail_chars),
        )

    def rows(self, texts: Sequence[str | None]) -> list[np.ndarray]:
        """Active bucket ids per text's query block (scaled by 1/sqrt(count) in :meth:`offset`)."""
        return [ngram_buckets(query_block(t or ""), self.ngrams, self.dim, self.tail_chars) for t in texts]

    def offset(
        self, texts: Sequence[str | None], prompt_tokens: Sequence[float], tasks: Sequence[str | None]
    ) -> np.ndarray:
        """Predicted output tokens minus the per-task mean, ``[n, K]`` (0 for a task without a model)."""
        out = np.zeros((len(texts), self.n_candidates))
        lp = np.log1p(np.asarray(prompt_tokens, dtype=np.float64))
        for i, (text, task) in enumerate(zip(texts, tasks)):
            t = self.tasks.get(task or "")
            if t is not None and self.W[t].any():
                idx = self.rows([text])[0]
                out[i] = row_sum(self.W[t], idx) / np.sqrt(max(len(idx), 1)) + lp[i] * self.W[t][-1]
        return out
