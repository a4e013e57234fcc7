"""Output tokens predicted from the request itself, for any traffic (a task the table never held included).

Per candidate a linear model of ``log1p(output tokens)`` (tokens: the table's counts) over features that carry
across tasks, fitted on every task of the table at once (``training/length_fit.py``):

* cue flags read from the request text (:mod:`.length_cues`): code ("write a function", a code fence), a letter or
  option answer ("answer with the letter", "(A) …"), a short answer ("yes or no", "one word"), a long one
  ("explain", "step by step", "essay"), arithmetic, a closing question mark, a blank to fill;
* a requested length ("in 200 words", "3 paragraphs") as log1p of its tokens (:data:`.length_cues.UNIT_TOKENS`);
* log1p of the earlier turns / blocks, of the prompt tokens and of the query's characters;
* hashed byte 3/4-grams of the text's tail (:func:`.student.ngram_buckets`, :data:`DIM` buckets).

**Predictive interval**: the model's residuals in leave-task-out CV inside the training rows give, per
candidate, the 10th and 90th percentiles (an 80 % interval) and the smearing factor that turns the
predicted log into a mean (Duan's estimate: mean of ``exp(residual)``).

**Support**: a request unlike every training row, on which no informative cue (:data:`.length_cues.INFORMATIVE`)
that the training rows showed fires, gets no prediction from this model. Its similarity is the largest cosine
between its signed-hashed n-gram sketch (:data:`SKETCH` dims) and a sample of the training rows; the model's weight
rises linearly from 0 at ``support_lo`` to 1 at ``support_hi`` (the 2nd percentile of the training rows'
nearest-other-row similarity, fitted with the model), and the rest goes to the conservative per-candidate prior
(:func:`~litellm_energy_router.energy.profile.chat_output_tokens`: a chat-length answer), blended in log space. The
interval of the prior is ``PRIOR_BAND`` × the prior.

``max_tokens`` / ``max_completion_tokens`` of the request bound every figure where the request is priced
(:func:`.output_tokens.bound_tokens`).

``length.npz``: ``W[DIM, K]`` n-gram weights, ``V[F, K]`` dense weights, ``b[K]``, ``r_lo/r_hi/smear[K]``,
``prior[K]``, ``ref[R, SKETCH]`` (float16, unit rows), ``support[2]``, ``cues_seen[len(DENSE)]``. numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from litellm_energy_router.router.length_cues import DENSE, INFORMATIVE, dense_features
from litellm_energy_router.router.student import HASH_CHARS, ngram_buckets, row_sum

LENGTH_FILE = "length.npz"
DIM, SKETCH = 2**12, 512
NGRAMS, TAIL_CHARS = (3, 4), 600
REF_BLOCK = 16  # rows per support product: 16 x 512 is under OpenBLAS's threshold for threads (interface/gemv.c)
#: the no-support blend's cosines (:mod:`.adapt`): no weight at or below the first, full weight from the second
SUPPORT_BLEND = (0.45, 0.70)
SUPPORT_FULL = SUPPORT_BLEND[1]
PRIOR_BAND = (0.25, 2.5)  # the chat prior's 80 % interval, × the prior (chat answers span two orders of magnitude)
_BANDS = np.array([[1.0], [PRIOR_BAND[0]], [PRIOR_BAND[1]]])  # × the prior: its mean, 80 % low and high


def buckets(text: str) -> np.ndarray:
    return ngram_buckets(text or "", NGRAMS, DIM, TAIL_CHARS)


def sketch(idx: np.ndarray) -> np.ndarray:
    """Unit signed-hash sketch (:data:`SKETCH` dims) of a sorted bucket set (:func:`buckets`), for the support
    similarity."""
    if not len(idx):
        return np.zeros(SKETCH)
    sign = _SIGN[idx] if 0 <= int(idx[0]) and int(idx[-1]) < DIM else _sign(idx)
    v = np.bincount(idx & (SKETCH - 1), weights=sign, minlength=SKETCH)  # sums of ±1: exact, as np.add.at was
    return v / max(math.sqrt(float(v @ v)), 1e-12)


def _sign(idx: np.ndarray) -> np.ndarray:
    """The ±1 of each bucket id in :func:`sketch`."""
    return np.where((idx * 2654435761 >> 13) & 1, 1.0, -1.0)


_SIGN = _sign(np.arange(DIM))  # the signs of every length-model bucket, read by :func:`sketch` instead of computed


def text_sketch(text: str) -> np.ndarray:
    """:func:`sketch` of ``text``'s n-gram buckets as float32 (read-only), computed once per text tail: the support
    and the text cluster (:func:`.context.text_cluster`) of one request share it."""
    return _tail_sketch(text[-HASH_CHARS:])  # the key of the request's shared n-gram pass


@lru_cache(maxsize=32)
def _tail_sketch(tail: str) -> np.ndarray:
    v = sketch(buckets(tail)).astype(np.float32)  # buckets of its last TAIL_CHARS characters
    v.flags.writeable = False
    return v


def _blocks(ref: np.ndarray) -> np.ndarray:
    """``ref[R, SKETCH]`` as ``[ceil(R / REF_BLOCK), REF_BLOCK, SKETCH]`` (the last block padded with copies of the last
    row: the maximum is unchanged). One product of the whole matrix makes BLAS wake its threads for each request,
    which costs milliseconds on a busy machine; products of blocks this small run on the calling thread, with the
    same sums."""
    if not len(ref):
        return ref
    pad = -len(ref) % REF_BLOCK
    return np.concatenate([ref, np.repeat(ref[-1:], pad, axis=0)]).reshape(-1, REF_BLOCK, ref.shape[1])


@dataclass
class LengthPrediction:
    """Output tokens per request and candidate: ``mean``, 80 % interval ``lo``/``hi`` ``[n, K]``, the model's
    ``weight[n]`` against the prior (1: the model alone, 0: the prior alone) and ``support[n]`` (cosine)."""

    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    weight: np.ndarray
    support: np.ndarray

    def source(self, i: int) -> str:
        w = float(self.weight[i])
        return "length_model" if w >= 1.0 else "prior" if w <= 0.0 else "length_model+prior"


class LengthModel:
    """The served cross-task length model (module docstring). ``prior`` alone (``W`` None) is the model of a
    checkpoint whose table has no output tokens: every request gets the prior."""

    def __init__(
        self,
        prior: Sequence[float],
        W: np.ndarray | None = None,
        V: np.ndarray | None = None,
        b: np.ndarray | None = None,
        r_lo: np.ndarray | None = None,
        r_hi: np.ndarray | None = None,
        smear: np.ndarray | None = None,
        ref: np.ndarray | None = None,
        support: Sequence[float] = (1.0, 1.0),
        cues_seen: np.ndarray | None = None,
    ) -> None:
        self.prior = np.asarray(prior, dtype=np.float64)
        K = len(self.prior)
        self.W, self.V, self.b = W, V, b
        z = np.zeros(K)
        self.r_lo = z if r_lo is None else np.asarray(r_lo, dtype=np.float64)
        self.r_hi = z if r_hi is None else np.asarray(r_hi, dtype=np.float64)
        self.smear = np.ones(K) if smear is None else np.asarray(smear, dtype=np.float64)
        self.ref = np.zeros((0, SKETCH), dtype=np.float16) if ref is None else np.asarray(ref, dtype=np.float16)
        self._ref = _blocks(self.ref.astype(np.float32))  # once, not per request
        self._offsets = np.stack([np.log(self.smear), self.r_lo, self.r_hi])  # [3, K]: mean, 80 % low, high
        self.support_lo, self.support_hi = (float(support[0]), float(support[1]))
        self.cues_seen = np.zeros(len(DENSE), dtype=bool) if cues_seen is None else np.asarray(cues_seen, dtype=bool)
        self._cue_cols = np.flatnonzero(INFORMATIVE & self.cues_seen[: len(INFORMATIVE)])  # seen informative cues
        if W is not None and (np.shape(W) != (DIM, K) or np.shape(V) != (len(DENSE), K)):
            raise ValueError(f"length model: weights {np.shape(W)} / {np.shape(V)} do not fit {K} candidates")
        #: the n-gram weights' row sums at a request's bucket ids (or a part of :class:`.student.SharedRows`)
        self.rows: Callable[[np.ndarray], np.ndarray] | None = None if W is None else partial(row_sum, W)

    @property
    def n_candidates(self) -> int:
        return len(self.prior)

    @classmethod
    def load(cls, path: str | Path) -> "LengthModel":
        with np.load(path, allow_pickle=False) as z:
            if "W" not in z:
                return cls(z["prior"])
            return cls(
                z["prior"],
                z["W"],
                z["V"],
                z["b"],
                z["r_lo"],
                z["r_hi"],
                z["smear"],
                z["ref"],
                z["support"].tolist(),
                z["cues_seen"],
            )

    def save(self, path: str | Path) -> None:
        if self.W is None:
            np.savez(path, prior=self.prior)
            return
        np.savez(
            path,
            prior=self.prior,
            W=self.W,
            V=self.V,
            b=self.b,
            r_lo=self.r_lo,
            r_hi=self.r_hi,
            smear=self.smear,
            ref=self.ref,
            support=np.array([self.support_lo, self.support_hi]),
            cues_seen=self.cues_seen,
        )

    def log_mu(
        self, texts: Sequence[str | None], prompt_tokens: Sequence[float]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(predicted log1p(tokens) ``[n, K]``, support cosine ``[n]``, a seen informative cue fires ``[n]``)."""
        n, K = len(texts), self.n_candidates
        mu, sup, cue = np.zeros((n, K)), np.zeros(n), np.zeros(n, dtype=bool)
        for i, (t, p) in enumerate(zip(texts, prompt_tokens)):
            idx, d = buckets(t or ""), dense_features(t or "", float(p))
            mu[i] = self.rows(idx) / math.sqrt(max(len(idx), 1)) + d @ self.V + self.b
            cue[i] = bool((d[self._cue_cols] > 0).any())
            if len(self.ref):
                sup[i] = self.support(text_sketch(t or ""))
        return mu, sup, cue

    def support(self, v: np.ndarray) -> float:
        """The largest cosine between sketch ``v`` and the reference rows, in growing chunks of ``[blocks,
        REF_BLOCK]`` products. Once a row reaches :data:`SUPPORT_FULL` or the model's ``support_hi``, every weight
        that reads the support is full whatever the rest holds: the scan stops and that row's cosine (a lower bound
        of the largest) is the figure. Decisions are those of the full scan."""
        best, stop = -np.inf, max(self.support_hi, SUPPORT_FULL)
        for a, b in ((0, 2), (2, 16), (16, len(self._ref))):
            if a < len(self._ref):
                best = max(best, float(np.max(self._ref[a:b] @ v)))
                if best >= stop:
                    break
        return best

    def predict(
        self, texts: Sequence[str | None], prompt_tokens: Sequence[float], prior: np.ndarray | None = None
    ) -> LengthPrediction:
        """``prior`` (tokens per candidate): the one to blend toward (default: the model's own)."""
        n, K = len(texts), self.n_candidates
        prior = self.prior if prior is None else np.asarray(prior, dtype=np.float64)
        log_p = np.log1p(prior * _BANDS)  # [3, K]: the prior's mean, 80 % low and high, log1p
        if self.W is None:
            w, sup, mu = np.zeros(n), np.zeros(n), np.zeros((n, K))
        else:
            mu, sup, cue = self.log_mu(texts, prompt_tokens)
            lo, span = self.support_lo, max(self.support_hi - self.support_lo, 1e-9)
            w = np.array(
                [1.0 if c else min(max((s - lo) / span, 0.0), 1.0) for c, s in zip(cue.tolist(), sup.tolist())]
            )
        ww = w[:, None, None]
        out = np.maximum(np.expm1(ww * (mu[:, None, :] + self._offsets) + (1 - ww) * log_p), 0.0)  # [n, 3, K]
        return LengthPrediction(out[:, 0], out[:, 1], out[:, 2], w, sup)
