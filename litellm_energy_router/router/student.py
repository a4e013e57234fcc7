"""The distilled student: a linear model over hashed byte n-grams that imitates the LM router's slot logits.

``energy-router train`` fits it at the end (:mod:`litellm_energy_router.training.distil_student`) on the LM's
own slot logits for the training queries, with and without their task, and ships it in the checkpoint
(``student.npz`` + the manifest's ``student`` entry). At serving time it replaces the forward pass when
``router.scorer`` says so: one pass over the last ``tail_chars`` characters of the query (the LM reads
only its last ``max_len`` tokens), numpy only, tens of microseconds. Its output goes through the same
calibration (:func:`~litellm_energy_router.router.model.scores_from_logits`) as the LM's, so the two
are interchangeable; the LM stays the reference (README: fidelity of the student).

Features of a query: every byte n-gram (``ngrams``) of the lower-cased, UTF-8 encoded tail (``tail_chars``),
hashed to ``dim`` (a power of two) buckets, as 0/1 indicators scaled by 1/sqrt(number of active buckets); plus one
indicator per task seen in training (none for an unknown task, as for production traffic). Training's default is the
length model's buckets (3- and 4-grams of the last 600 characters, 4,096 buckets: :mod:`.length_model`), so a request
is hashed once and both models' rows are summed in one gather (:class:`SharedRows`); a student trained before
2026-12-08 reads 2- to 4-grams of 1,024 characters in 65,536 buckets and is served as it was (docs/benchmarks.md).
"""

from __future__ import annotations

import math
from functools import lru_cache, partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

STUDENT_FILE = "student.npz"
_MULT = np.uint64(0x9E3779B1)  # odd multiplier (Fibonacci hashing)


#: one request's tail hashed once: every consumer of a shorter ASCII tail reads its suffix (the student and the length
#: model read 600 characters; a student trained before 2026-12-08 reads 1,024 and hashes its own tail)
HASH_CHARS = 600


def ngram_buckets(text: str, ngrams: Sequence[int], dim: int, tail_chars: int) -> np.ndarray:
    """Sorted unique bucket ids (intp, read-only) of the byte n-grams of ``text``'s lower-cased tail; ``dim`` is a
    power of two. An n-gram ``c1..cn`` hashes as ``(((2·257 + c1)·257 + c2)·257 … + cn) · M`` (mod 2⁶⁴),
    whose bits 16 and up give the bucket; n-grams of different lengths never share a hash. One request's text is
    hashed once: the student, the length model and the text cluster read the buckets of the same
    :data:`HASH_CHARS`-character tail (a small LRU cache; an ASCII tail's suffix is a suffix of its bytes)."""
    ngrams = tuple(ngrams)  # each model's own tuple: a cache key of the pass, in any order (n < 2: none)
    if tail_chars <= HASH_CHARS:
        long = text[-HASH_CHARS:]
        tail = text[-tail_chars:]
        if len(tail) == len(long) or long.isascii():
            return _suffix_buckets(long, len(tail), ngrams, dim)
    return _suffix_buckets(text[-tail_chars:], tail_chars, ngrams, dim)


@lru_cache(maxsize=32)
def _hashes(tail: str, ngrams: tuple[int, ...], wide: bool = False) -> tuple[np.ndarray, ...]:
    """Per n ≥ 2 of ``ngrams``, in increasing n: the mixed hash ``(h · M) >> 16`` of the n-gram starting at each byte of
    the tail, as uint16 (its low 16 bits: every bucket of ``dim`` ≤ 2¹⁶), or with ``wide`` as uint64 (48 bits). The
    narrow pass runs in uint32: ``h`` and ``h · M`` mod 2³² are the low bits of the same sums mod 2⁶⁴, at half the
    bytes. The shorter n-grams' sums are built on the way, mixed only when asked for."""
    raw = np.frombuffer(tail.lower().encode("utf-8", "replace"), dtype=np.uint8)
    t = np.uint64 if wide else np.uint32
    b = raw.astype(t)
    h, out, mult, shift = b + t(2 * 257), [], t(_MULT), t(16)
    for n in range(2, max(ngrams, default=1) + 1):
        h = h[:-1] * t(257)
        h += b[n - 1 :]
        if n in ngrams:
            m = h * mult
            m >>= shift
            out.append(m if wide else m.astype(np.uint16))
    return tuple(out)


@lru_cache(maxsize=32)
def _suffix_buckets(tail: str, chars: int, ngrams: tuple[int, ...], dim: int) -> np.ndarray:
    """The buckets of the last ``chars`` characters of ``tail`` (all of them, or an ASCII tail's suffix)."""
    narrow = dim <= 2**16
    hs = _hashes(tail, ngrams, not narrow)
    skip = max(len(tail) - chars, 0)  # ASCII when > 0: characters are bytes
    parts = [h[skip:] for h in hs]
    if narrow:  # 16-bit ids: the low bits of a hash are the bucket of a dim ≤ 2**16
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
        if dim < 2**16:
            ids &= np.uint16(dim - 1)
        out = _marked(ids, dim=dim) if dim <= 2**12 else _sorted_unique(ids)
    else:
        out = _marked(*parts, dim=dim, mask=np.uint64(dim - 1))
    out.flags.writeable = False  # shared by every caller of the cache
    return out


def _sorted_unique(ids: np.ndarray) -> np.ndarray:
    """The distinct values of 16-bit ``ids`` in increasing order, as intp (a radix sort, then the value changes)."""
    ids.sort()
    keep = np.empty(len(ids), dtype=bool)
    keep[:1] = True
    np.not_equal(ids[1:], ids[:-1], out=keep[1:])
    return ids[keep].astype(np.intp)


def _marked(*parts: np.ndarray, dim: int, mask: np.integer | None = None) -> np.ndarray:
    """The distinct ids of ``parts`` (each ``& mask`` when given) in increasing order: marked in a boolean array of
    ``dim``, then read in order. Faster than the sort for a small ``dim`` (10 vs 12 µs for 1,200 ids at 4,096) and for
    wide ids, slower at 65,536 (17 vs 11 µs)."""
    seen = np.zeros(dim, dtype=bool)
    for p in parts:
        seen[p if mask is None else (p & mask).astype(np.intp)] = True
    return np.flatnonzero(seen)


def row_sum(W: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``W[idx].sum(axis=0)`` in float64 (``[K]``). One einsum pass over the gathered ``[len(idx), K]`` rows: numpy's
    axis-0 reduction of so narrow an array walks it column by column and costs three times as much (a matrix-vector
    product would be as fast but may wake BLAS threads; docs/benchmarks.md)."""
    return np.einsum("ij->j", W.take(idx, axis=0), dtype=np.float64)


class SharedRows:
    """Several weight tables ``[dim, K_i]`` read at the same bucket ids in one gather: a checkpoint whose student reads
    the length model's buckets (:meth:`Student.reads`; every checkpoint trained since 2026-12-08) sums the rows of
    both with one ``take`` and one reduction per request instead of one of each per model. Each column is summed in
    the same order as from its own table: the same sums, bit for bit (tests/test_student.py)."""

    def __init__(self, *tables: np.ndarray) -> None:
        self.W = np.ascontiguousarray(np.hstack([np.asarray(t, dtype=np.float64) for t in tables]))
        ends = np.cumsum([np.shape(t)[1] for t in tables]).tolist()
        self._cols = list(zip([0, *ends[:-1]], ends))
        self._last: tuple[np.ndarray, np.ndarray] | None = None  # (bucket ids, their sums): the request being scored

    def part(self, i: int) -> Callable[[np.ndarray], np.ndarray]:
        """The row sums of table ``i`` at bucket ids ``idx`` (float64 ``[K_i]``), as :func:`row_sum` of that table."""
        a, b = self._cols[i]
        return lambda idx: self.sums(idx)[a:b]

    def sums(self, idx: np.ndarray) -> np.ndarray:
        """Every table's row sums at ``idx``; the last request's are reused when ``idx`` is the same (read-only,
        cached) array: one request's models read one bucket set in turn. Thread-safe: the pair is read and replaced
        whole, and a request whose pair another thread replaced sums again."""
        last = self._last
        if last is None or last[0] is not idx:
            last = self._last = (idx, row_sum(self.W, idx))
        return last[1]


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
        # the float32 values as stored, held as float64: the same sums as float32 rows summed in float64, without a
        # cast per gathered row (a third of a request's row sum; 1.5 MiB more per 2**16 x 6 weights)
        self.W = np.ascontiguousarray(np.asarray(W, dtype=np.float32), dtype=np.float64)
        self.W_task = np.asarray(W_task, dtype=np.float64)
        self.b = np.asarray(b, dtype=np.float64)
        self.tasks = {t: i for i, t in enumerate(tasks)}
        self.ngrams = tuple(int(n) for n in ngrams)
        self.tail_chars = int(tail_chars)
        self.dim = self.W.shape[0]
        if self.dim & (self.dim - 1) or min(self.ngrams, default=0) < 2:
            raise ValueError(f"student: dim {self.dim} is not a power of two or n-grams {self.ngrams} include n < 2")
        self.rows: Callable[[np.ndarray], np.ndarray] = partial(row_sum, self.W)  # or a part of SharedRows

    def reads(self, ngrams: Sequence[int], dim: int, tail_chars: int) -> bool:
        """Whether the student's features are the bucket ids of ``ngrams`` / ``dim`` / ``tail_chars``."""
        return (self.ngrams, self.dim, self.tail_chars) == (tuple(ngrams), dim, tail_chars)

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
            z = self.rows(idx) / math.sqrt(max(len(idx), 1)) + self.b
            t = self.tasks.get(task or "")
            out[i] = z + self.W_task[t] if t is not None else z
        return out
