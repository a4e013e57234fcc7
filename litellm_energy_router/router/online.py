"""Production corrects the energy estimate between retrains: :class:`OnlineEnergy`.

Each settled production row updates, per candidate and per context key (:mod:`.context`), an exponentially
weighted ratio of sums (``window`` rows: every update multiplies the older sums by ``1 - 1/window``)::

    q = sum(joules measured) / sum(joules the checkpoint estimated for those requests)

Joules measured: the meter's (J); without them (no meter, or it had no answer) the token-based figure of the
row's own tokens, ``prompt_tokens * j_prompt + output_tokens * j_out`` (so the output tokens production writes
correct a wrong length prior even without a meter). Joules estimated: the decision's checkpoint estimate for
the served candidate (before any online correction); without it, the checkpoint's J/token with its unknown-task
prior of the output tokens.

One row's measured / estimated ratio counts within ``ROW_RATIO_MAX`` (16) times its level's current ratio either
way: a request of 30,000 output tokens (or a meter's glitch) among rows at the estimate moves its candidate's ratio
as a 16x row does, not as a 1,000x one, while traffic really priced 100x too low is learned in a few rows (each
row may go 16x beyond what the level learned so far).

**Shrinkage** (the stated rule): with ``n`` the (decayed) row count of a level, its ratio enters as
``(n * q + N0 * parent) / (n + N0)``: the candidate's rows shrink toward the checkpoint (ratio 1), a context's
rows toward the candidate's. ``adjust(E, context) -> E' = q' * E``. So for requests like those seen, after ``n``
rows of a context Ê is within ``N0 / (n + N0)`` of the way back from the measured joules (at most; the
candidate level closes part of the rest): with :data:`N0` = 4, 80 % of the gap closed after 16 rows, 90 %
after 36. ``uncertainty(context)[K] = N0 / (n + N0)`` (1 for a candidate production has never priced) feeds
the exploration (:func:`explore_weights`), and so, where a context's labelled rows shaped ``P``, does the share of
draws of ``P`` in which each candidate is the best choice (:func:`optimal_share`: exploration aimed at the
candidates the context's rows have not ruled out). Thread-safe (the writer thread updates, the event loop reads); numpy
only; memory bounded (:data:`MAX_KEYS` context keys, least recently updated dropped).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

ROW_RATIO_MAX = 16.0  # a row's ratio counts within [q/16, 16 q] of its level's ratio q: no single row steers it
N0 = 4.0  # pseudo-rows of the parent level (checkpoint, then candidate) in every shrunk ratio
WINDOW = 500.0  # rows: older rows' weight decays by 1 - 1/WINDOW per update of the same key
MAX_KEYS = 10_000  # context keys kept (per state); the least recently updated beyond it are dropped
EXPLORE_FLOOR = 0.1  # every candidate keeps this share of a uniform exploration (propensities never 0)


class _Sums:
    """Decayed sums of one (key, candidate): rows, joules measured, joules estimated."""

    __slots__ = ("j_est", "j_meas", "n")

    def __init__(self) -> None:
        self.n = self.j_meas = self.j_est = 0.0

    def add(self, j_meas: float, j_est: float, decay: float) -> None:
        self.n, self.j_meas, self.j_est = self.n * decay + 1, self.j_meas * decay + j_meas, self.j_est * decay + j_est


def _bounded(j: float, est: float, s: _Sums) -> float:
    """``j`` (J) within ``ROW_RATIO_MAX`` of what level ``s`` has learned: ``est * q`` times [1/R, R], q its
    measured / estimated ratio so far (1 before any row)."""
    q = s.j_meas / s.j_est if s.n > 0 and s.j_est > 0 else 1.0
    return min(max(j, est * q / ROW_RATIO_MAX), est * q * ROW_RATIO_MAX)


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

    def __init__(
        self,
        candidates: Sequence[str],
        j_out: Sequence[float],
        j_prompt: Sequence[float],
        prior_tokens: Sequence[float],
        *,
        n0: float = N0,
        window: float = WINDOW,
    ) -> None:
        self.candidates = tuple(candidates)
        self.ix = {c: i for i, c in enumerate(self.candidates)}
        self.j_out, self.j_prompt = np.asarray(j_out, dtype=float), np.asarray(j_prompt, dtype=float)
        self.prior_tokens = np.asarray(prior_tokens, dtype=float)
        self.n0, self.decay = float(n0), 1.0 - 1.0 / float(window)
        self._cand = [_Sums() for _ in self.candidates]
        self._ctx: OrderedDict[str, list[_Sums]] = OrderedDict()
        self._lock = threading.Lock()
        self.rows = 0

    def update(
        self,
        candidate: str,
        prompt_tokens: float,
        output_tokens: float,
        joules: float | None,
        context: str | None = None,
        estimate_j: float | None = None,
    ) -> bool:
        """Account one settled row: tokens, ``joules`` (J; None: the token-based figure), ``context`` (its key,
        :attr:`.context.Context.key` or cluster; None: the candidate level only), ``estimate_j`` (J: the checkpoint's
        estimate at decision time). False (nothing learned) for an unknown candidate or bad numbers."""
        k = self.ix.get(candidate)
        if k is None or not _ok(prompt_tokens) or not _ok(output_tokens):
            return False
        pt = float(prompt_tokens)
        j = float(joules) if _ok(joules) else pt * self.j_prompt[k] + float(output_tokens) * self.j_out[k]
        est = float(estimate_j) if _ok(estimate_j) else pt * self.j_prompt[k] + self.prior_tokens[k] * self.j_out[k]
        if est <= 0:
            return False
        with self._lock:
            self._cand[k].add(_bounded(j, est, self._cand[k]), est, self.decay)
            if context:
                sums = self._ctx.pop(context, None) or [_Sums() for _ in self.candidates]
                sums[k].add(_bounded(j, est, sums[k]), est, self.decay)
                self._ctx[context] = sums
                while len(self._ctx) > MAX_KEYS:
                    self._ctx.popitem(last=False)
            self.rows += 1
        return True

    def ratios(self, context: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(``q'[K]`` measured / estimated joules, shrunk as in the module docstring; ``n[K]`` rows of the most
        specific level)."""
        K = len(self.candidates)
        q, n = np.ones(K), np.zeros(K)
        with self._lock:
            ctx = self._ctx.get(context) if context else None
            for k in range(K):
                for s in [self._cand[k]] + ([ctx[k]] if ctx is not None else []):
                    if s.n > 0:
                        q[k] = shrink(s.n, s.j_meas / s.j_est, q[k], self.n0)
                n[k] = ctx[k].n if ctx is not None else self._cand[k].n
        return q, n

    def adjust(self, E: np.ndarray, context: str | None = None) -> np.ndarray:
        """``E'[K] = q'[K] * E[K]`` (J), ``E`` the checkpoint's Ê (J); unchanged before any row."""
        if self.rows == 0:
            return E
        return self.ratios(context)[0] * np.asarray(E, dtype=float)

    def context_rows(self, context: str | None) -> float:
        """Production rows (decayed counts, all candidates) of ``context``; 0 for an unknown or no context."""
        with self._lock:
            ctx = self._ctx.get(context) if context else None
            return float(sum(s.n for s in ctx)) if ctx is not None else 0.0

    def uncertainty(self, context: str | None = None) -> np.ndarray:
        """``[K]`` in (0, 1]: ``n0 / (n + n0)`` of each candidate's row count (its context's, when it has rows)."""
        with self._lock:
            ctx = self._ctx.get(context) if context else None
            n = np.array(
                [max(self._cand[k].n, ctx[k].n if ctx is not None else 0.0) for k in range(len(self.candidates))]
            )
        return self.n0 / (n + self.n0)


NEW_CONTEXT_ROWS = 50.0  # production rows over which a new context's exploration falls to router.epsilon


def context_epsilon(epsilon: float, epsilon_new: float, rows: float) -> float:
    """The exploration rate of a context with ``rows`` production rows: ``epsilon_new`` for a new one, falling
    linearly to ``epsilon`` at :data:`NEW_CONTEXT_ROWS` (never below ``epsilon``)."""
    if epsilon_new <= epsilon:
        return epsilon
    return epsilon + (epsilon_new - epsilon) * max(0.0, 1.0 - max(rows, 0.0) / NEW_CONTEXT_ROWS)


@dataclass(frozen=True)
class Explore:
    """What a request's exploration draws on, per candidate ``[K]``: the energy ``uncertainty``
    (:meth:`OnlineEnergy.uncertainty`; None: no online energy state) and ``spread``, what the standard deviation of
    its ``P`` is computed from when exploration is aimed: ``(P, rows, n0, scale)`` for ``scale ·`` :func:`p_sd`
    (None: ``P`` is the scorer's alone, no context's rows shaped it)."""

    uncertainty: np.ndarray | None
    spread: tuple[np.ndarray, np.ndarray, float, float] | None = None

    @property
    def p_sd(self) -> np.ndarray | None:
        """``[K]``: the standard deviation of ``P`` (None without a ``spread``)."""
        if self.spread is None:
            return None
        P, rows, n0, scale = self.spread
        return scale * p_sd(P, rows, n0)

    def weights(
        self,
        avail: Sequence[int],
        P: np.ndarray,
        E: np.ndarray,
        j_best: int,
        choose: Callable[..., np.ndarray] | None = None,
    ) -> np.ndarray:
        """:func:`explore_weights` over the ``avail`` candidates (``P``, ``E`` (J): theirs, as decided on; ``j_best``:
        the decision among them), aimed by :func:`optimal_share` under ``choose`` (the knob's rule) where ``P``
        has a spread (``router.explore: aimed``; None: by energy uncertainty alone)."""
        u = self.uncertainty[avail] if self.uncertainty is not None else np.ones(len(avail))
        aimed = None
        if choose is not None and self.spread is not None:
            aimed = optimal_share(P, E, self.p_sd[avail], choose)
            aimed[j_best] = 0.0  # exploring is trying another: the greedy choice has its 1 - ε
        return explore_weights(u, aimed=aimed)


def p_sd(P: np.ndarray, rows: np.ndarray, n0: float) -> np.ndarray:
    """``sqrt(P (1 - P) / (rows + n0 + 1))``: the spread of a context's ``P[K]`` built from ``rows[K]`` labelled rows
    of its own and ``n0`` pseudo-rows of its parent (:func:`.context._shrink`)."""
    P = np.clip(np.asarray(P, dtype=float), 0.0, 1.0)
    return np.sqrt(P * (1.0 - P) / (np.asarray(rows, dtype=float) + n0 + 1.0))


AIM_DRAWS = 64  # draws of P per decision in optimal_share
_Z = np.random.default_rng(20261206).standard_normal((AIM_DRAWS, 32))  # fixed: the same inputs give the same share


def optimal_share(P: np.ndarray, E: np.ndarray, sd: np.ndarray, choose: Callable[..., np.ndarray]) -> np.ndarray:
    """``[K]``: the share of :data:`AIM_DRAWS` draws ``P + sd · z`` (clipped to [0, 1]; ``z`` fixed standard normal
    draws) in which each candidate is the decision ``choose(P_draws[S, K], E[S, K])`` (the knob's rule) on ``E[K]``
    (J): how likely each one is the best choice given what the context's rows leave unknown."""
    K = len(P)
    z = _Z[:, :K] if K <= _Z.shape[1] else np.random.default_rng(K).standard_normal((AIM_DRAWS, K))
    draws = np.clip(np.asarray(P, dtype=float) + np.asarray(sd, dtype=float) * z, 0.0, 1.0)
    return np.bincount(choose(draws, np.broadcast_to(E, draws.shape)), minlength=K) / AIM_DRAWS


def explore_weights(
    uncertainty: np.ndarray, floor: float = EXPLORE_FLOOR, aimed: np.ndarray | None = None
) -> np.ndarray:
    """The exploration distribution over the available candidates: ``floor`` spread uniformly, the rest in
    proportion to each one's energy ``uncertainty`` (so the candidates production has priced least are tried
    most) or, with ``aimed`` (:func:`optimal_share`, the greedy choice's share set to 0), half that way and half
    by ``aimed`` (so the other candidates that may well be the best choice are tried most; all of it to the
    energy share when no other one is). Sums to 1, every entry ≥ ``floor / K`` (logged propensities stay
    exact and never 0)."""
    u = np.asarray(uncertainty, dtype=float)
    K = len(u)
    if K == 0:
        return u
    share = u / u.sum() if u.sum() > 0 else np.full(K, 1.0 / K)
    if aimed is not None and len(aimed) == K and np.sum(aimed) > 0:
        share = 0.5 * share + 0.5 * np.asarray(aimed, dtype=float) / np.sum(aimed)
    return floor / K + (1.0 - floor) * share


def _ok(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v >= 0


def explore_within(
    eps: float, weights: np.ndarray | None, E: np.ndarray, max_energy_j: float | None, cheapest: bool
) -> tuple[float, np.ndarray | None]:
    """(ε, exploration weights) kept inside what the knob allows: no candidate whose Ê (``E``, J, the available
    candidates') is over ``max_energy_j`` (J) is explored, and none at all when ``cheapest`` (a hard budget's
    ``cheapest`` action: the tenant is over its cap). ε = 0 when nothing is left to explore."""
    if eps <= 0 or cheapest:
        return 0.0, None
    if max_energy_j is None:
        return eps, weights
    w = np.ones(len(E)) if weights is None else np.asarray(weights, dtype=np.float64)
    w = np.where(np.asarray(E) <= max_energy_j, w, 0.0)
    return (eps, w) if w.sum() > 0 else (0.0, None)


def explore_pick(rng: Any, epsilon: float, j_best: int, weights: np.ndarray | None, k: int) -> tuple[int, float]:
    """(the index chosen among ``k`` available candidates, its exact propensity): ``j_best`` with probability
    ``1 - epsilon``, else a draw from ``weights`` (:func:`explore_weights`, renormalised; None: uniform)."""
    q = (
        np.full(k, 1.0 / k)
        if weights is None or len(weights) != k
        else np.asarray(weights, dtype=float) / np.sum(weights)
    )
    j = j_best
    if epsilon > 0 and rng.random() < epsilon:
        j = int(min(np.searchsorted(np.cumsum(q), rng.random() * q.sum(), side="right"), k - 1))
    return j, float((1 - epsilon) * (j == j_best) + epsilon * q[j])
