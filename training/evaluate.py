"""Judging routers on held-out queries: accuracy–energy curves, AIQ, and the reference points.

Inputs are dense matrices over ``n`` held-out queries and ``K`` candidates: correctness ``Y`` in [0, 1],
true energy ``E`` (J); a router contributes predicted success ``P`` and its routing-time energy
estimate ``Ê`` (J). The knob is swept with the shared decision rule
(:mod:`litellm_energy_router.router.decide`), the same code that serves requests.

Definitions (energy in mean J per query, accuracy = mean score):

* **static points** — always one candidate; the **zero router** is their non-decreasing concave hull
  (what random mixtures of static models reach).
* **random** — each query sent to a candidate drawn uniformly (expected value, one point).
* **oracle** — per query the cheapest candidate (true J) among those with the best score; a query no
  candidate answers goes to the cheapest. That is the λ = 0 end of the oracle *curve*: the decision rule
  swept with ``P = Y`` and ``Ê = E``, the frontier no router can pass.
* **AIQ** (RouterBench) — area under the non-decreasing concave hull of a curve's (J, accuracy) points
  over [0, x_max], divided by x_max; x_max is the pool's largest always-one-model mean J; the hull is 0
  below its cheapest point and flat after its last.
* **J at best** — the J the hull needs to reach the pooled accuracy of the best single candidate
  (interpolated; inf if never); **acc at half** — the hull's accuracy at half that candidate's J.
* **phase transition** — the λ at which the share of queries sent to the *large* candidates (mean J above
  the pool's median) crosses 50 %, and its width: log10 of the λ ratio between the 75 % and 25 % crossings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from litellm_energy_router.knob import Knob
from litellm_energy_router.router.decide import decide, lambda_grid

from .data import MatrixError

# -- resamples ----------------------------------------------------------------------------------------


def bootstrap_rows(n: int, n_boot: int, seed: int = 0) -> list[np.ndarray]:
    """``n_boot`` resamples (with replacement) of ``n`` query rows: :func:`evaluate`'s ``folds`` for paired intervals."""
    rng = np.random.default_rng(seed)
    return list(rng.integers(0, n, size=(n_boot, n)))


def interval95(x: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of ``x`` (resampled differences): a 95 % interval."""
    lo, hi = np.percentile(np.asarray(x, dtype=np.float64), [2.5, 97.5])
    return float(lo), float(hi)


# -- hull and area ------------------------------------------------------------------------------------


def pareto_hull(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Vertices (ascending J) of the non-decreasing concave upper hull of points ``(x, y)``.

    It starts at the cheapest point (the best one among equally cheap) and ends at the leftmost point of
    highest ``y``; vertices strictly increase in both coordinates.
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if x.size == 0 or x.size != y.size:
        raise ValueError(f"pareto_hull: need equal, non-empty x and y (got {x.size}, {y.size})")
    order = np.lexsort((-y, x))  # by x, then best y first
    hull: list[tuple[float, float]] = []
    for xi, yi in zip(x[order], y[order]):
        if hull and xi == hull[-1][0]:
            continue  # same J, lower accuracy
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (yi - y1) - (y2 - y1) * (xi - x1) >= 0:  # hull[-1] on or below the chord
                hull.pop()
            else:
                break
        hull.append((xi, yi))
    hx = np.array([p[0] for p in hull])
    hy = np.array([p[1] for p in hull])
    top = int(np.argmax(hy))  # first (cheapest) maximum
    return hx[: top + 1], hy[: top + 1]


def hull_value(hx: np.ndarray, hy: np.ndarray, x: float | np.ndarray) -> np.ndarray | float:
    """The hull as a function of J: 0 below its cheapest vertex, linear between, flat after the last."""
    xv = np.asarray(x, dtype=np.float64)
    v = np.where(xv < hx[0], 0.0, np.interp(xv, hx, hy))
    return float(v) if v.ndim == 0 else v


def aiq(x: Sequence[float], y: Sequence[float], x_max: float) -> float:
    """AIQ of the points ``(x, y)``: area under their non-decreasing concave hull over [0, x_max] / x_max."""
    hx, hy = pareto_hull(x, y)
    return hull_area(hx, hy, x_max) / float(x_max)


def hull_area(hx: np.ndarray, hy: np.ndarray, x_max: float) -> float:
    """Exact area under :func:`hull_value` over [0, x_max] (piecewise linear)."""
    if x_max <= hx[0]:
        return 0.0
    pts = np.concatenate([[hx[0]], hx[(hx > hx[0]) & (hx < x_max)], [x_max]])
    vals = np.interp(pts, hx, hy)
    return float(np.sum((pts[1:] - pts[:-1]) * (vals[1:] + vals[:-1]) / 2))


def joules_at_accuracy(hx: np.ndarray, hy: np.ndarray, target: float) -> float:
    """Least mean J at which the hull reaches ``target`` accuracy (interpolated); inf if it never does."""
    if hy[-1] < target - 1e-12:
        return float("inf")
    if hy[0] >= target:
        return float(hx[0])
    if hy[-1] < target:  # within the tolerance below it (two sums of the same scores differ in their last bit)
        return float(hx[-1])
    i = int(np.searchsorted(hy, target))  # hy[i-1] < target <= hy[i]
    t = (target - hy[i - 1]) / (hy[i] - hy[i - 1])
    return float(hx[i - 1] + t * (hx[i] - hx[i - 1]))


# -- curves -------------------------------------------------------------------------------------------


@dataclass
class Curve:
    """Operating points of one router: knob values, mean true J, accuracy, share per candidate [L, K]."""

    name: str
    mode: str  # "lambda" | "target" | "static" | "oracle" | "random"
    knob: np.ndarray
    energy_j: np.ndarray
    accuracy: np.ndarray
    shares: np.ndarray

    @classmethod
    def from_choices(
        cls, name: str, mode: str, knob: Sequence[float], choices: np.ndarray, Y: np.ndarray, E: np.ndarray
    ) -> "Curve":
        """From chosen candidate indices ``choices[L, n]`` (one row per operating point)."""
        C = np.atleast_2d(np.asarray(choices, dtype=np.int64))
        rows = np.arange(Y.shape[0])
        acc = Y[rows[None, :], C].mean(axis=1)
        en = E[rows[None, :], C].mean(axis=1)
        shares = np.stack([np.bincount(c, minlength=Y.shape[1]) / len(c) for c in C])
        return cls(name, mode, np.asarray(knob, dtype=np.float64), en, acc, shares)

    def hull(self) -> tuple[np.ndarray, np.ndarray]:
        return pareto_hull(self.energy_j, self.accuracy)


def choices(P: np.ndarray, Ehat: np.ndarray, knobs: Sequence[Knob]) -> np.ndarray:
    """``choices[L, n]``: the decision rule (:func:`~litellm_energy_router.router.decide.decide`) at each knob."""
    return np.stack([decide(P, Ehat, k) for k in knobs])


def sweep_lambda(
    P: np.ndarray,
    Ehat: np.ndarray,
    Y: np.ndarray,
    E: np.ndarray,
    e_ref: float,
    n_points: int = 41,
    name: str = "router",
) -> tuple[Curve, np.ndarray]:
    """λ sweep over :func:`lambda_grid` (most accurate → cheapest). Returns the curve and ``choices[L, n]``."""
    lams = lambda_grid(P, Ehat, e_ref, n_points)
    C = choices(P, Ehat, [Knob.point(lambda_=float(lam), e_ref_j=e_ref) for lam in lams])
    return Curve.from_choices(name, "lambda", lams, C, Y, E), C


def sweep_target(
    P: np.ndarray, Ehat: np.ndarray, Y: np.ndarray, E: np.ndarray, n_points: int = 41, name: str = "router"
) -> Curve:
    """Accuracy-target sweep: targets spread over the quantiles of ``P`` (plus 0 and above 1)."""
    qs = np.quantile(P, np.linspace(0, 1, max(n_points - 2, 1)))
    targets = np.unique(np.concatenate([[0.0], qs, [1.0 + 1e-9]]))
    C = choices(P, Ehat, [Knob.point(target_accuracy=float(t)) for t in targets])
    return Curve.from_choices(name, "target", targets, C, Y, E)


def oracle_choices(Y: np.ndarray, E: np.ndarray) -> np.ndarray:
    """Per query: the cheapest (true J) candidate among those with the best score; if the best score is
    0, the cheapest candidate."""
    best = Y.max(axis=1, keepdims=True)
    ok = (Y >= best) & (best > 0)
    cheapest_ok = np.argmin(np.where(ok, E, np.inf), axis=1)
    return np.where(ok.any(axis=1), cheapest_ok, np.argmin(E, axis=1))


# -- phase transition ---------------------------------------------------------------------------------


@dataclass
class Phase:
    """Where along λ the routing flips from small to large candidates (None: no crossing in the sweep)."""

    lam50: float | None
    width_decades: float | None  # log10(λ at 25 % large / λ at 75 % large)
    large: list[str]
    large_share_at_0: float


def _crossing(lams: np.ndarray, share: np.ndarray, level: float) -> float | None:
    """First λ where ``share`` (non-increasing in λ, roughly) falls below ``level``; log-interpolated."""
    for i in range(len(lams) - 1):
        if share[i] >= level > share[i + 1]:
            a, b = lams[i], lams[i + 1]
            t = (share[i] - level) / (share[i] - share[i + 1])
            if a <= 0:
                return float(a + t * (b - a))
            return float(np.exp(np.log(a) + t * (np.log(b) - np.log(a))))
    return None


def phase_transition(curve: Curve, static_energy: np.ndarray, candidates: Sequence[str]) -> Phase:
    med = float(np.median(static_energy))
    large = static_energy > med
    share = curve.shares[:, large].sum(axis=1)
    lam50 = _crossing(curve.knob, share, 0.5)
    l75, l25 = _crossing(curve.knob, share, 0.75), _crossing(curve.knob, share, 0.25)
    width = float(np.log10(l25 / l75)) if (l75 and l25 and l75 > 0) else None
    return Phase(lam50, width, [c for c, big in zip(candidates, large) if big], float(share[0]))


# -- one evaluation -----------------------------------------------------------------------------------


@dataclass
class MethodResult:
    """A router's (or a reference point's) curve and scores."""

    name: str
    curve: Curve
    aiq: float
    joules_at_best: float  # J to reach the best single candidate's accuracy (inf: never)
    acc_at_half: float  # accuracy at half the best single candidate's J
    target_curve: Curve | None = None
    aiq_target: float | None = None
    aiq_folds: list[float] = field(default_factory=list)
    joules_ratio_folds: list[float] = field(default_factory=list)  # per fold: J at the best single's accuracy / its J
    phase: Phase | None = None
    kind: str = "router"  # router | zero | random | oracle
    calibration: "Calibration | None" = None  # of the predicted P (routers only)


@dataclass
class Calibration:
    """How well a router's predicted success probabilities ``P[n, K]`` match the outcomes.

    ``brier``: mean squared error of P against the scores (lower is better). ``ece``: expected
    calibration error, the count-weighted mean of |mean P − observed success| over ``bins`` equal-width
    bins of P. ``bins``: the reliability table, one ``(lo, hi, count, mean_p, observed)`` per non-empty bin.
    """

    brier: float
    ece: float
    bins: list[tuple[float, float, int, float, float]]


def calibration(P: np.ndarray, Y: np.ndarray, n_bins: int = 10) -> Calibration:
    """The :class:`Calibration` of ``P`` against outcomes ``Y`` (same shape, scores in [0, 1]), every
    (query, candidate) pair one forecast."""
    p, y = np.asarray(P, dtype=np.float64).ravel(), np.asarray(Y, dtype=np.float64).ravel()
    idx = np.minimum((np.clip(p, 0, 1) * n_bins).astype(int), n_bins - 1)
    bins, ece = [], 0.0
    for b in range(n_bins):
        sel = idx == b
        if sel.any():
            mp, obs = float(p[sel].mean()), float(y[sel].mean())
            bins.append((b / n_bins, (b + 1) / n_bins, int(sel.sum()), mp, obs))
            ece += sel.sum() / len(p) * abs(mp - obs)
    return Calibration(float(np.mean((p - y) ** 2)), float(ece), bins)


@dataclass
class Evaluation:
    """Everything the report shows. ``best`` is the index of the most accurate single candidate."""

    candidates: list[str]
    n: int
    static_energy: np.ndarray
    static_accuracy: np.ndarray
    x_max: float
    best: int
    methods: list[MethodResult]
    n_folds: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def best_energy(self) -> float:
        return float(self.static_energy[self.best])

    @property
    def best_accuracy(self) -> float:
        return float(self.static_accuracy[self.best])

    def method(self, name: str) -> MethodResult:
        for m in self.methods:
            if m.name == name:
                return m
        raise KeyError(f"no method {name!r} (have: {', '.join(m.name for m in self.methods)})")

    def paired_fold_delta(self, a: str, b: str) -> tuple[float, float] | None:
        """Mean and sd over folds of AIQ(a) − AIQ(b) on the same test folds (None without folds)."""
        fa, fb = self.method(a).aiq_folds, self.method(b).aiq_folds
        if len(fa) < 2 or len(fa) != len(fb):
            return None
        d = np.asarray(fa) - np.asarray(fb)
        return float(d.mean()), float(d.std(ddof=1))

    def rows(self) -> list[dict]:
        """One summary dict per method: AIQ, J at best accuracy, savings %, accuracy at half J, phase λ."""
        out = []
        for m in self.methods:
            j = m.joules_at_best
            out.append(
                {
                    "method": m.name,
                    "kind": m.kind,
                    "aiq": m.aiq,
                    "aiq_fold_mean": float(np.mean(m.aiq_folds)) if m.aiq_folds else None,
                    "aiq_fold_sd": float(np.std(m.aiq_folds, ddof=1)) if len(m.aiq_folds) > 1 else None,
                    "aiq_target": m.aiq_target,
                    "joules_at_best": j,
                    "savings_pct": (1 - j / self.best_energy) * 100 if np.isfinite(j) else None,
                    "acc_at_half": m.acc_at_half,
                    "max_accuracy": float(m.curve.accuracy.max()),
                    "phase_lambda": m.phase.lam50 if m.phase else None,
                    "phase_width_decades": m.phase.width_decades if m.phase else None,
                }
            )
        return out


def _score(ev_best_acc: float, best_e: float, x_max: float, curve: Curve) -> tuple[float, float, float]:
    hx, hy = curve.hull()
    return (
        hull_area(hx, hy, x_max) / x_max,
        joules_at_accuracy(hx, hy, ev_best_acc),
        float(hull_value(hx, hy, best_e / 2)),
    )


def evaluate(
    Y: np.ndarray,
    E: np.ndarray,
    routers: Mapping[str, tuple[np.ndarray, np.ndarray]],
    candidates: Sequence[str],
    *,
    e_ref: float | None = None,
    n_points: int = 41,
    folds: Sequence[np.ndarray] | None = None,
) -> Evaluation:
    """Score every router in ``routers`` (name → ``(P[n, K], Ê[n, K] in J)``) on the held-out rows.

    ``e_ref`` (J) scales λ (default: the largest mean Ê of any candidate); ``folds`` (test-row index
    arrays) adds per-fold AIQ to each router's result.
    """
    Y = np.asarray(Y, dtype=np.float64)
    E = np.asarray(E, dtype=np.float64)
    n, K = Y.shape
    if E.shape != (n, K) or len(candidates) != K:
        raise ValueError(f"evaluate: Y {Y.shape}, E {E.shape} and {len(candidates)} candidates disagree")
    se, sa = E.mean(axis=0), Y.mean(axis=0)
    x_max = float(se.max())
    if not x_max > 0:  # AIQ is an area per joule of the costliest candidate: 0 J has none
        raise MatrixError(f"evaluate: the rows record {x_max:g} J for every candidate ({', '.join(candidates)})")
    best = int(np.lexsort((se, -sa))[0])  # most accurate; ties: cheaper
    ev = Evaluation(list(candidates), n, se, sa, x_max, best, [], n_folds=len(folds) if folds is not None else 0)
    _add_references(ev, Y, E, n_points)
    for name, (P, Ehat) in routers.items():
        P, Ehat = np.asarray(P, dtype=np.float64), np.asarray(Ehat, dtype=np.float64)
        if P.shape != (n, K) or Ehat.shape != (n, K):
            raise ValueError(f"router {name!r}: P {P.shape} / Ê {Ehat.shape} must be {(n, K)}")
        ref = float(e_ref) if e_ref is not None else float(Ehat.mean(axis=0).max())
        curve, C = sweep_lambda(P, Ehat, Y, E, ref, n_points, name)
        tc = sweep_target(P, Ehat, Y, E, n_points, name)
        per_fold, j_fold = [], []
        for idx in folds or []:
            fc = Curve.from_choices(name, "lambda", curve.knob, C[:, idx], Y[idx], E[idx])
            per_fold.append(aiq(fc.energy_j, fc.accuracy, float(E[idx].mean(axis=0).max())))
            fx, fy = fc.hull()
            j_fold.append(joules_at_accuracy(fx, fy, float(Y[idx, best].mean())) / float(E[idx, best].mean()))
        hx, hy = tc.hull()
        _add(
            ev,
            name,
            curve,
            "router",
            target_curve=tc,
            aiq_target=hull_area(hx, hy, x_max) / x_max,
            aiq_folds=per_fold,
            joules_ratio_folds=j_fold,
            phase=phase_transition(curve, se, candidates),
            calibration=calibration(P, Y),
        )
    return ev


def _add(ev: Evaluation, name: str, curve: Curve, kind: str, **kw) -> MethodResult:
    """Score ``curve`` against ``ev``'s best single candidate and append it to ``ev.methods``."""
    a, j, h = _score(ev.best_accuracy, ev.best_energy, ev.x_max, curve)
    res = MethodResult(name, curve, a, j, h, kind=kind, **kw)
    ev.methods.append(res)
    return res


def _add_references(ev: Evaluation, Y: np.ndarray, E: np.ndarray, n_points: int) -> None:
    """The reference points: the zero router (the static candidates' hull), random choice and the oracle."""
    K, se, sa = len(ev.candidates), ev.static_energy, ev.static_accuracy
    zero = Curve("zero router (static hull)", "static", np.arange(K), se, sa, np.eye(K))
    _add(ev, "zero router (static hull)", zero, "zero")
    uniform = np.full((1, K), 1 / K)
    rnd = Curve("random", "random", np.array([0.0]), np.array([se.mean()]), np.array([sa.mean()]), uniform)
    _add(ev, "random", rnd, "random")
    # the oracle knows Y and the true E: at λ = 0 it sends each query to the cheapest candidate with the
    # best score; its λ sweep is the frontier no router can pass (it maximises Y − λ·E per query)
    ocurve, _ = sweep_lambda(Y, E, Y, E, ev.x_max, max(n_points, 201), "oracle")
    ocurve.mode = "oracle"
    _add(ev, "oracle", ocurve, "oracle")
