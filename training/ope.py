"""Off-policy evaluation: a router's accuracy and joules on traffic that another router served.

Production rows carry the serving router's propensity ``p_i = π₀(a_i | x_i)`` for the candidate
``a_i`` it chose (the serving config's ``router.epsilon`` keeps every ``p_i`` above 0). For a new
policy ``π`` with ``w_i = π(a_i | x_i) / p_i``:

* **IPS** ``V = mean(w_i · r_i)`` — unbiased; 95 % interval ``V ± 1.96 · sd(w·r) / √n``.
* **SNIPS** ``V = Σ w_i r_i / Σ w_i`` — self-normalised, lower variance, slightly biased; interval by the
  delta method, ``se = √(Σ w_i² (r_i − V)²) / Σ w_i``.

``r`` is the row's score (accuracy, in [0, 1]) or its energy (J). numpy only.

Each production row also names the **logging router version** (``router_version``: the checkpoint whose
decision served it; ``unknown`` for rows written before the column existed). Rows logged by different
versions may be pooled: each row's propensity is the probability under the policy that served *it*, so
IPS/SNIPS stay unbiased over a mixture of logging policies. What pooling hides is a version whose rows
disagree with the others (a changed candidate pool, a broken release), so every estimate reports its
rows per logging version and a separate SNIPS estimate per version (:attr:`PolicyEstimate.by_version`),
and :func:`evaluate_checkpoint_on_log` can keep only chosen versions (``logging_versions``).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

_Z = {0.90: 1.6448536, 0.95: 1.959964, 0.99: 2.5758293}


def _z(level: float) -> float:
    if level in _Z:
        return _Z[level]
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + level / 2)


def finite(v: Any) -> Any:
    """``v`` with every non-finite float (NaN, ±inf: an estimate that does not exist) as None."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    return v


@dataclass
class Estimate:
    """One off-policy estimate: ``value`` with a ``level`` (e.g. 0.95) interval [``lo``, ``hi``];
    ``n`` logged rows, ``ess`` effective sample size ``(Σw)² / Σw²`` (rows' worth of evidence)."""

    value: float
    lo: float
    hi: float
    n: int
    ess: float
    level: float = 0.95

    def covers(self, x: float) -> bool:
        return self.lo <= x <= self.hi

    def as_dict(self) -> dict[str, float | None]:
        """The fields, a non-finite one (an interval from one row, SNIPS with no overlap) as None: JSON has no NaN."""
        return finite(asdict(self))

    def __str__(self) -> str:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)) and math.isfinite(self.value):
            return f"{self.value:.4g} [no interval: {self.ess:.1f} effective rows]"
        return f"{self.value:.4g} [{self.lo:.4g}, {self.hi:.4g}]"


def _check(rewards: Any, propensities: Any, target_probs: Any) -> tuple[np.ndarray, np.ndarray]:
    r = np.asarray(rewards, dtype=np.float64)
    p = np.asarray(propensities, dtype=np.float64)
    q = np.asarray(target_probs, dtype=np.float64)
    if not (r.shape == p.shape == q.shape) or r.ndim != 1:
        raise ValueError(
            f"off-policy estimate: rewards {r.shape}, propensities {p.shape}, target probs {q.shape} must be equal 1-d"
        )
    if len(r) == 0:
        raise ValueError("off-policy estimate: no logged rows")
    if not np.all((p > 0) & (p <= 1)):
        bad = p[~((p > 0) & (p <= 1))][0]
        raise ValueError(
            f"off-policy estimate: propensity {bad} outside (0, 1] (log an exploration rate router.epsilon > 0)"
        )
    if not np.all((q >= 0) & (q <= 1)):
        raise ValueError("off-policy estimate: target probabilities must be in [0, 1]")
    return r, q / p


def ips(rewards: Any, propensities: Any, target_probs: Any, level: float = 0.95) -> Estimate:
    """Inverse propensity scoring (see module docstring); ``target_probs[i] = π(a_i | x_i)``."""
    r, w = _check(rewards, propensities, target_probs)
    n = len(r)
    x = w * r
    v = float(x.mean())
    se = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else float("inf")
    ess = float(w.sum() ** 2 / (w**2).sum()) if w.any() else 0.0
    h = _z(level) * se
    return Estimate(v, v - h, v + h, n, ess, level)


MIN_SNIPS_ESS = 10.0  # effective rows below which SNIPS gives its value without an interval (bounds NaN)


def snips(rewards: Any, propensities: Any, target_probs: Any, level: float = 0.95) -> Estimate:
    """Self-normalised IPS (see module docstring). ``nan`` when the new policy never agrees with the log."""
    r, w = _check(rewards, propensities, target_probs)
    n, sw = len(r), float(w.sum())
    if sw <= 0:
        return Estimate(float("nan"), float("nan"), float("nan"), n, 0.0, level)
    v = float((w * r).sum() / sw)
    se = float(math.sqrt(((w * (r - v)) ** 2).sum()) / sw)
    ess = sw**2 / float((w**2).sum())
    if ess < MIN_SNIPS_ESS:  # the delta method's interval on a handful of rows (one: zero width) is no interval
        return Estimate(v, float("nan"), float("nan"), n, ess, level)
    h = _z(level) * se
    return Estimate(v, v - h, v + h, n, ess, level)


def target_probs(chosen: Sequence[int], logged: Sequence[int], k: int, epsilon: float = 0.0) -> np.ndarray:
    """``π(a_i | x_i)`` of a router that picks ``chosen[i]`` and explores uniformly with ``epsilon``
    over ``k`` candidates, evaluated at the logged action ``logged[i]`` (``-1``: a candidate the router does not
    have, which it never picks: 0)."""
    c, a = np.asarray(chosen), np.asarray(logged)
    return np.where(a >= 0, (1 - epsilon) * (c == a) + epsilon / k, 0.0)  # -1: a candidate the router lacks


@dataclass
class PolicyEstimate:
    """A router's estimated accuracy and mean joules (J) on logged traffic, by IPS and SNIPS."""

    n: int
    matched: int  # logged rows where the new router picks the logged candidate
    accuracy_ips: Estimate
    accuracy_snips: Estimate
    joules_ips: Estimate
    joules_snips: Estimate
    logged_accuracy: float
    logged_joules: float
    logging_versions: dict[str, int] = field(default_factory=dict)  # logged rows per logging router version
    by_version: dict[str, dict[str, Any]] = field(default_factory=dict)  # SNIPS per version (>= 2 versions)

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "matched": self.matched,
            "logged_accuracy": self.logged_accuracy,
            "logged_joules": self.logged_joules,
            "logging_versions": dict(self.logging_versions),
            "by_version": {
                v: {k: x.as_dict() if isinstance(x, Estimate) else x for k, x in d.items()}
                for v, d in self.by_version.items()
            },
            "accuracy_ips": self.accuracy_ips.as_dict(),
            "accuracy_snips": self.accuracy_snips.as_dict(),
            "joules_ips": self.joules_ips.as_dict(),
            "joules_snips": self.joules_snips.as_dict(),
        }

    def lines(self, name: str) -> list[str]:
        return [
            f"{name}: {self.n} logged rows ({self.matched} where it agrees with the log); logged policy: "
            f"accuracy {self.logged_accuracy:.3f}, {self.logged_joules:.1f} J/request",
            f"  accuracy  IPS {self.accuracy_ips}  SNIPS {self.accuracy_snips}  (95% CI)",
            f"  joules    IPS {self.joules_ips}  SNIPS {self.joules_snips}  (95% CI, J/request)",
            "  logged by router version: " + ", ".join(f"{v} ({n} rows)" for v, n in self.logging_versions.items()),
        ] + [
            f"    {v}: accuracy SNIPS {d['accuracy_snips']}, joules SNIPS {d['joules_snips']}"
            for v, d in self.by_version.items()
        ]


def logged_rows(runs: Iterable[Mapping[str, Any]], cap: int | None = None, seed: int = 0) -> list[Mapping[str, Any]]:
    """Production rows usable for off-policy evaluation: served successfully, scored, with energy and a
    propensity in (0, 1]. ``cap``: at most this many, a uniform sample without replacement of the usable
    rows (reservoir sampling over the stream: memory bounded however many the table holds; the IPS and
    SNIPS means of a uniform sample estimate the same value, their intervals computed on the sample)."""
    out: list[Mapping[str, Any]] = []
    rng = random.Random(seed)
    seen = 0
    for r in runs:
        p = r.get("propensity")
        if r.get("source") != "production" or r.get("status") == "failure" or p is None or not 0 < p <= 1:
            continue
        if r.get("score") is None or r.get("energy_j") is None:
            continue
        seen += 1
        if cap is None or len(out) < cap:
            out.append(r)
        else:
            j = rng.randrange(seen)
            if j < cap:
                out[j] = r
    return out


UNKNOWN_VERSION = "unknown"


def logging_version(row: Mapping[str, Any]) -> str:
    """The router version that logged ``row`` (:data:`UNKNOWN_VERSION` when the row does not say)."""
    v = row.get("router_version")
    return str(v) if v else UNKNOWN_VERSION


def version_counts(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Logged rows per logging router version, most rows first."""
    counts: dict[str, int] = {}
    for r in rows:
        v = logging_version(r)
        counts[v] = counts.get(v, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _per_version(
    rows: Sequence[Mapping[str, Any]], q: np.ndarray, p: np.ndarray, acc: np.ndarray, joules: np.ndarray, level: float
) -> dict[str, dict[str, Any]]:
    versions = np.array([logging_version(r) for r in rows])
    out: dict[str, dict[str, Any]] = {}
    if len(set(versions.tolist())) < 2:
        return out
    for v in version_counts(rows):
        k = versions == v
        if k.sum() >= 2:
            out[v] = {
                "n": int(k.sum()),
                "accuracy_snips": snips(acc[k], p[k], q[k], level),
                "joules_snips": snips(joules[k], p[k], q[k], level),
            }
    return out


def estimate_policy(
    rows: Sequence[Mapping[str, Any]],
    chosen: Sequence[str],
    candidates: Sequence[str],
    epsilon: float = 0.0,
    level: float = 0.95,
) -> PolicyEstimate:
    """Estimate a router that would choose ``chosen[i]`` (a candidate name) for logged row ``rows[i]``;
    pooled over logging versions, and per version when the rows come from several."""
    if len(rows) != len(chosen):
        raise ValueError(f"estimate_policy: {len(rows)} rows but {len(chosen)} choices")
    idx = {c: j for j, c in enumerate(candidates)}
    logged = np.array([idx.get(r["candidate"], -1) for r in rows])
    new = np.array([idx[c] for c in chosen])
    q = target_probs(new, logged, len(candidates), epsilon)
    p = np.array([float(r["propensity"]) for r in rows])
    acc = np.array([float(r["score"]) for r in rows])
    joules = np.array([float(r["energy_j"]) for r in rows])
    return PolicyEstimate(
        n=len(rows),
        matched=int((new == logged).sum()),
        accuracy_ips=ips(acc, p, q, level),
        accuracy_snips=snips(acc, p, q, level),
        joules_ips=ips(joules, p, q, level),
        joules_snips=snips(joules, p, q, level),
        logged_accuracy=float(acc.mean()),
        logged_joules=float(joules.mean()),
        logging_versions=version_counts(rows),
        by_version=_per_version(rows, q, p, acc, joules, level),
    )


def policy_choices(model: Any, rows: Sequence[Mapping[str, Any]], knob: Any) -> list[str]:
    """The candidate ``model`` (any :class:`~litellm_energy_router.router.scoring.Scorer`) chooses for each
    logged row under ``knob`` (:class:`~litellm_energy_router.knob.Knob`), as serving would: the query text
    without a task tag, the row's prompt tokens, the one decision rule."""
    from litellm_energy_router.router.decide import decide

    texts = [r["text"] for r in rows]
    tasks = [None] * len(rows)
    P = model.score(texts, tasks)
    E = model.energy(texts, tasks, prompt_tokens=[int(r.get("prompt_tokens") or 0) for r in rows])
    return [model.candidates[j] for j in decide(P, E, knob)]


def evaluate_checkpoint_on_log(
    store: Any,
    checkpoint: Any,
    *,
    knob: Any = None,
    epsilon: float = 0.0,
    rows: Sequence[Mapping[str, Any]] | None = None,
    level: float = 0.95,
    logging_versions: Sequence[str] | None = None,
) -> PolicyEstimate | None:
    """Off-policy estimate of the router in ``checkpoint`` (a path or a loaded scorer) at ``knob``
    (:class:`~litellm_energy_router.knob.Knob`; default: the default settings' knob) on the logged
    production rows of ``store`` (or ``rows``); ``logging_versions`` keeps only rows logged by those
    router versions (``unknown``: rows that do not say). Production queries are scored without a task
    tag, as serving scores them. ``None`` when no usable logged row names one of the router's candidates."""
    from litellm_energy_router.knob import Knob
    from litellm_energy_router.router.scoring import load_scorer

    model = load_scorer(checkpoint) if isinstance(checkpoint, (str, Path)) else checkpoint
    rows = logged_rows(store.iter_runs(sources=["production"])) if rows is None else list(rows)
    # a row logged on a candidate the router lacks stays, at weight 0: dropping it inflated IPS by 1 / P(kept)
    rows = [r for r in rows if r.get("text")]
    if logging_versions is not None:
        keep = set(logging_versions)
        rows = [r for r in rows if logging_version(r) in keep]
    if not rows:
        return None
    chosen = policy_choices(model, rows, knob if knob is not None else Knob())
    return estimate_policy(rows, chosen, model.candidates, epsilon, level)
