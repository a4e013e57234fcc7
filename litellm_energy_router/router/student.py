"""The distilled student: a linear model over hashed byte n-grams that imitates the LM router's slot logits.

``energy-router train`` fits it at the end (:mod:`litellm_energy_router.training.distil_student`) on the LM's
own slot logits for the training queries, with and without their task, and ships it in the checkpoint
(``student.npz`` + the manifest's ``student`` entry). At serving time it replaces the forward pass when
``router.scorer`` says so: one pass over the last ``tail_chars`` characters of the query (the LM reads
only its last ``max_len`` tokens), numpy only, tens of microseconds. Its output goes through the same
calibration (:func:`~litellm_energy_router.router.model.scores_from_logits`) as the LM's, so the two
are interchangeable; the LM stays the reference (README: fidelity of the student).

Features of a query: every byte n-gram (``ngrams``, e.g. 2..4) of the lower-cased, UTF-8 encoded tail,
hashed to ``dim`` (a power of two) buckets, as 0/1 indicators scaled by 1/sqrt(number of active buckets); plus one
indicator per task seen in training (none for an unknown task, as for production traffic).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

STUDENT_FILE = "student.npz"
_MULT = np.uint64(0x9E3779B1)  # odd multiplier (Fibonacci hashing)


def ngram_buckets(text: str, ngrams: Sequence[int], dim: int, tail_chars: int) -> np.ndarray:
    """Sorted unique bucket ids (intp, read-only) of the byte n-grams of ``text``'s lower-cased tail; ``dim`` is a
    power of two. An n-gram ``c1..cn`` hashes as ``(((2·257 + c1)·257 + c2)·257 … + cn) · M`` (mod 2⁶⁴),
    whose bits 16 and up give the bucket; n-grams of different lengths never share a hash. One request's text is
    hashed once: the student, the length model and the text cluster read the same tail (a small LRU cache)."""
    return _tail_buckets(text[-tail_chars:], tuple(ngrams), dim)


@lru_cache(maxsize=32)
def _tail_buckets(tail: str, ngrams: tuple[int, ...], dim: int) -> np.ndarray:
    b = np.frombuffer(tail.lower().encode("utf-8", "replace"), dtype=np.uint8).astype(np.uint64)
    h = b + np.uint64(2 * 257)
    parts = []
    for n in range(2, max(ngrams) + 1):
        h = h[:-1] * np.uint64(257) + b[n - 1 :]
        if n in ngrams and len(h):
            parts.append(h)
    if not parts:
        out = np.zeros(0, dtype=np.intp)
    else:
        a = ((np.concatenate(parts) * _MULT) >> np.uint64(16)) & np.uint64(dim - 1)
        a.sort()
        out = a[np.concatenate(([True], a[1:] != a[:-1]))].astype(np.intp)
    out.flags.writeable = False  # shared by every caller of the cache
    return out


class Student:
    """Loaded student weights: ``W[dim, K]``, ``W_task[T, K]`` for the training tasks, bias ``b[K]``."""

    def __init__(
        self,
        W: np.ndarray,
        W_task: np.ndarray,
        b: np.ndarray,
        tasks: Sequence[str],
        ngrams: Sequence[int],
        tail_chars: int,
    ) -> None:
        self.W = np.ascontiguousarray(W, dtype=np.float64)
        self.W_task = np.asarray(W_task, dtype=np.float64)
        self.b = np.asarray(b, dtype=np.float64)
        self.tasks = {t: i for i, t in enumerate(tasks)}
        self.ngrams = tuple(int(n) for n in ngrams)
        self.tail_chars = int(tail_chars)
        self.dim = self.W.shape[0]
        if self.dim & (self.dim - 1) or min(self.ngrams, default=0) < 2:
            raise ValueError(f"student: dim {self.dim} is not a power of two or n-grams {self.ngrams} include n < 2")

    @classmethod
    def load(cls, path: str | Path) -> "Student":
        with np.load(path, allow_pickle=False) as z:
            return cls(
                z["W"], z["W_task"], z["b"], [str(t) for t in z["tasks"]], z["ngrams"].tolist(), int(z["tail_chars"])
            )

    def save(self, path: str | Path) -> None:
        np.savez(
            path,
            W=self.W.astype(np.float32),
            W_task=self.W_task,
            b=self.b,
            tasks=np.array(list(self.tasks), dtype=str),
            ngrams=np.array(self.ngrams),
            tail_chars=np.array(self.tail_chars),
        )

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
            z = self.W[idx].sum(axis=0) / np.sqrt(max(len(idx), 1)) + self.b
            t = self.tasks.get(task or "")
            out[i] = z + self.W_task[t] if t is not None else z
        return out
