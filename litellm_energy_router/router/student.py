"""The distilled student: a linear model over hashed byte n-grams that imitates the LM router's slot logits.

``energy-router train`` fits it at the end (:mod:`litellm_energy_router.training.student`) on the LM's
own slot logits for the training queries, with and without their task, and ships it in the checkpoint
(``student.npz`` + the manifest's ``student`` entry). At serving time it replaces the forward pass when
``router.scorer`` says so: one pass over the last ``tail_chars`` characters of the query (the LM reads
only its last ``max_len`` tokens), numpy only, tens of microseconds. Its output goes through the same
calibration (:func:`~litellm_energy_router.router.model.scores_from_logits`) as the LM's, so the two
are interchangeable; the LM stays the reference (README: fidelity of the student).

Features of a query: every byte n-gram (``ngrams``, e.g. 2..4) of the lower-cased, UTF-8 encoded tail,
hashed to ``dim`` buckets, as 0/1 indicators scaled by 1/sqrt(number of active buckets); plus one
indicator per task seen in training (none for an unknown task, as for production traffic).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

STUDENT_FILE = "student.npz"
_MULT = np.uint64(0x9E3779B1)  # odd multiplier (Fibonacci hashing)


def ngram_buckets(text: str, ngrams: Sequence[int], dim: int, tail_chars: int) -> np.ndarray:
    """Sorted unique bucket ids (int64) of the byte n-grams of ``text``'s lower-cased tail."""
    t = text[-tail_chars:].lower().encode("utf-8", "replace")
    b = np.frombuffer(t, dtype=np.uint8).astype(np.uint64)
    parts = []
    for n in ngrams:
        if len(b) < n:
            continue
        h = np.full(len(b) - n + 1, np.uint64(n), dtype=np.uint64)
        for i in range(n):
            h = h * np.uint64(257) + b[i : len(b) - n + 1 + i]
        parts.append((h * _MULT) >> np.uint64(16))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.unique((np.concatenate(parts) % np.uint64(dim)).astype(np.int64))


class Student:
    """Loaded student weights: ``W[dim, K]``, ``W_task[T, K]`` for the training tasks, bias ``b[K]``."""

    def __init__(self, W: np.ndarray, W_task: np.ndarray, b: np.ndarray, tasks: Sequence[str], ngrams: Sequence[int],
                 tail_chars: int) -> None:  # fmt: skip
        self.W = np.ascontiguousarray(W, dtype=np.float32)
        self.W_task = np.asarray(W_task, dtype=np.float64)
        self.b = np.asarray(b, dtype=np.float64)
        self.tasks = {t: i for i, t in enumerate(tasks)}
        self.ngrams = tuple(int(n) for n in ngrams)
        self.tail_chars = int(tail_chars)
        self.dim = self.W.shape[0]

    @classmethod
    def load(cls, path: str | Path) -> "Student":
        with np.load(path, allow_pickle=False) as z:
            return cls(z["W"], z["W_task"], z["b"], [str(t) for t in z["tasks"]], z["ngrams"].tolist(), int(z["tail_chars"]))

    def save(self, path: str | Path) -> None:
        np.savez(path, W=self.W, W_task=self.W_task, b=self.b, tasks=np.array(list(self.tasks), dtype=str),
                 ngrams=np.array(self.ngrams), tail_chars=np.array(self.tail_chars))  # fmt: skip

    @property
    def n_candidates(self) -> int:
        return self.W.shape[1]

    def features(self, text: str) -> np.ndarray:
        return ngram_buckets(text, self.ngrams, self.dim, self.tail_chars)

    def slot_logits(self, texts: Sequence[str], tasks: Sequence[str | None] | None = None) -> np.ndarray:
        """Predicted LM slot logits [n, K] (float64), to be calibrated like the LM's."""
        tasks = list(tasks) if tasks is not None else [None] * len(texts)
        out = np.empty((len(texts), self.n_candidates), dtype=np.float64)
        for i, (text, task) in enumerate(zip(texts, tasks)):
            idx = self.features(text or "")
            z = self.W[idx].sum(axis=0, dtype=np.float64) / np.sqrt(max(len(idx), 1)) + self.b
            t = self.tasks.get(task or "")
            out[i] = z + self.W_task[t] if t is not None else z
        return out
