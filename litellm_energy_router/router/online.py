"""Production corrects the energy estimate between retrains: :class:`OnlineEnergy`.

Each settled production row (measured joules, or without a meter the token-based estimate; its prompt and
output tokens) updates, per candidate and per context key (:mod:`.context`), two exponentially weighted
ratios of sums (``window`` rows: every update multiplies the older sums by ``1 - 1/window``):

* ``rho`` — output tokens written / output tokens the checkpoint expected for those requests (the decision's
  expected tokens; without them, the checkpoint's unknown-task prior of the candidate);
* ``r`` — joules measured / joules the checkpoint's J per token give for the tokens actually processed
  (``prompt_tokens * j_prompt + output_tokens * j_out``); a row without joules updates ``rho`` only.

**Shrinkage** (the stated rule): with ``n`` the (decayed) row count of a level, its value enters as
``(n * observed + N0 * parent) / (n + N0)``: the candidate's rows shrink toward the checkpoint (ratio 1), a
context's rows toward the candidate's. So after ``n`` rows the estimate has moved ``n / (n + N0)`` of the way
to what production measured: with :data:`N0` = 4, 80 % after 16 rows, 90 % after 36.

``adjust(E, tokens, context) -> E'`` for one request, ``E[K]`` the checkpoint's Ê (J) and ``tokens[K]`` its
expected output tokens: ``E' = r' * (E + j_out * tokens * (rho' - 1))`` (the prompt part ``E - j_out *
tokens`` scaled by ``r'`` only). ``uncertainty(context)[K] = N0 / (n + N0)``, 1 for a candidate production has
never priced, feeds the exploration (:func:`explore_weights`). Thread-safe (the writer thread updates, the
event loop reads); numpy only; memory bounded (:data:`MAX_KEYS` context keys, least recently updated dropped).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

N0 = 4.0  # pseudo-rows of the parent level (checkpoint, then candidate) in every shrunk ratio
WINDOW = 500.0  # rows: older rows' weight decays by 1 - 1/WINDOW per update of the same key
MAX_KEYS = 10_000  # context keys kept (per state); the least recently updated beyond it are dropped
EXPLORE_FLOOR = 0.1  # every candidate keeps this share of a uniform exploration (propensities never 0)


class _Sums:
    """Decayed sums of one (key, candidate): n rows, tokens out / expected, joules measured / modelled."""

    __slots__ = ("n", "t_out", "t_exp", "n_j", "j_meas", "j_model")

    def __init__(self) -> None:
        self.n = self.t_out = self.t_exp = self.n_j = self.j_meas = self.j_model = 0.0

    def add(self, t_out: float, t_exp: float, j_meas: float | None, j_model: float, decay: float) -> None:
        self.n, self.t_out, self.t_exp = self.n * decay + 1, self.t_out * decay + t_out, self.t_exp * decay + t_exp
        if j_meas is not None:
            self.n_j, self.j_meas, self.j_model = self.n_j * decay + 1, self.j_meas * decay + j_meas, self.j_model * decay + j_model


def shrink(n: float, observed: float, parent: float, n0: float = N0) -> float:
    """``(n * observed + n0 * parent) / (n + n0)``: a level's value shrunk toward its parent by its row count."""
    return (n * observed + n0 * parent) / (n + n0)


class OnlineEnergy:
    """Per candidate (and context key) corrections of Ê from settled production rows (module docstring).

    Args:
        candidates: names, in the order of the ``E``/``tokens`` arrays passed to :meth:`adjust`.
        j_out: the checkpoint's J per output token per candidate (J/token).
        j_prompt: its J per prompt token per candidate (J/token).
        prior_tokens: the checkpoint's output tokens for a request it knows nothing of, per candidate (the
            expected tokens of a row whose decision did not say).
    """

    def __init__(self, candidates: Sequence[str], j_out: Sequence[float], j_prompt: Sequence[float],
                 prior_tokens: Sequence[float], *, n0: float = N0, window: float = WINDOW) -> None:  # fmt: skip
        self.candidates = tuple(candidates)
        self.ix = {c: i for i, c in enumerate(self.candidates)}
        self.j_out, self.j_prompt = np.asarray(j_out, dtype=float), np.asarray(j_prompt, dtype=float)
        self.prior_tokens = np.asarray(prior_tokens, dtype=float)
        self.n0, self.decay = float(n0), 1.0 - 1.0 / float(window)
        self._cand = [_Sums() for _ in self.candidates]
        self._ctx: OrderedDict[str, list[_Sums]] = OrderedDict()
        self._lock = threading.Lock()
        self.rows = 0

    def update(self, candidate: str, prompt_tokens: float, output_tokens: float, joules: float | None,
               context: str | None = None, expected_tokens: float | None = None) -> bool:  # fmt: skip
        """Account one settled row (tokens; joules in J, None when unknown). ``context``: its context key
        (:attr:`.context.Context.key`), or None. False (nothing learned) for an unknown candidate or bad numbers."""
        k = self.ix.get(candidate)
        if k is None or not _ok(prompt_tokens) or not _ok(output_tokens):
            return False
        t_exp = float(expected_tokens) if _ok(expected_tokens) and expected_tokens > 0 else float(self.prior_tokens[k])
        j_model = float(prompt_tokens) * self.j_prompt[k] + float(output_tokens) * self.j_out[k]
        j = float(joules) if _ok(joules) and j_model > 0 else None
        with self._lock:
            self._cand[k].add(float(output_tokens), max(t_exp, 1.0), j, j_model, self.decay)
            if context:
                sums = self._ctx.pop(context, None) or [_Sums() for _ in self.candidates]
                sums[k].add(float(output_tokens), max(t_exp, 1.0), j, j_model, self.decay)
                self._ctx[context] = sums
                while len(self._ctx) > MAX_KEYS:
                    self._ctx.popitem(last=False)
            self.rows += 1
        return True

    def ratios(self, context: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(``rho'[K]`` output-token ratio, ``r'[K]`` joule ratio, ``n[K]`` rows of the most specific level) shrunk
        as in the module docstring."""
        K = len(self.candidates)
        rho, r, n = np.ones(K), np.ones(K), np.zeros(K)
        with self._lock:
            ctx = self._ctx.get(context) if context else None
            for k in range(K):
                levels = [self._cand[k]] + ([ctx[k]] if ctx is not None else [])
                for s in levels:
                    if s.n > 0:
                        rho[k] = shrink(s.n, s.t_out / max(s.t_exp, 1e-9), rho[k], self.n0)
                    if s.n_j > 0 and s.j_model > 0:
                        r[k] = shrink(s.n_j, s.j_meas / s.j_model, r[k], self.n0)
                n[k] = ctx[k].n if ctx is not None else self._cand[k].n
        return rho, r, n

    def adjust(self, E: np.ndarray, tokens: np.ndarray | None, context: str | None = None) -> np.ndarray:
        """``E'[K]`` (J) from the checkpoint's ``E[K]`` (J) and expected output ``tokens[K]`` (module docstring);
        ``E`` unchanged before any row."""
        if self.rows == 0:
            return E
        rho, r, _ = self.ratios(context)
        t = np.asarray(tokens, dtype=float) if tokens is not None else self.prior_tokens
        return np.maximum(r * (np.asarray(E, dtype=float) + self.j_out * t * (rho - 1.0)), 0.0)

    def uncertainty(self, context: str | None = None) -> np.ndarray:
        """``[K]`` in (0, 1]: ``n0 / (n + n0)`` of each candidate's row count (its context's, when it has rows)."""
        with self._lock:
            ctx = self._ctx.get(context) if context else None
            n = np.array([max(self._cand[k].n, ctx[k].n if ctx is not None else 0.0) for k in range(len(self.candidates))])
        return self.n0 / (n + self.n0)


def explore_weights(uncertainty: np.ndarray, floor: float = EXPLORE_FLOOR) -> np.ndarray:
    """The exploration distribution over the available candidates: ``floor`` spread uniformly, the rest in
    proportion to each one's energy ``uncertainty`` (so the candidates production has priced least are tried
    most). Sums to 1, every entry ≥ ``floor / K`` (logged propensities stay exact and never 0)."""
    u = np.asarray(uncertainty, dtype=float)
    K = len(u)
    if K == 0:
        return u
    share = u / u.sum() if u.sum() > 0 else np.full(K, 1.0 / K)
    return floor / K + (1.0 - floor) * share


def _ok(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v >= 0


def explore_pick(rng: Any, epsilon: float, j_best: int, weights: np.ndarray | None, k: int) -> tuple[int, float]:
    """(the index chosen among ``k`` available candidates, its exact propensity): ``j_best`` with probability
    ``1 - epsilon``, else a draw from ``weights`` (:func:`explore_weights`, renormalised; None: uniform)."""
    q = np.full(k, 1.0 / k) if weights is None or len(weights) != k else np.asarray(weights, dtype=float) / np.sum(weights)
    j = j_best
    if epsilon > 0 and rng.random() < epsilon:
        j = int(min(np.searchsorted(np.cumsum(q), rng.random() * q.sum(), side="right"), k - 1))
    return j, float((1 - epsilon) * (j == j_best) + epsilon * q[j])
