"""The demo's numbers: served traffic against static baselines and the router's λ sweep, and the plot.

Accuracy is the recorded RouterBench correctness of the answer each policy gets; energy is the mean
**estimated** joules per query (profile × tokens). The baselines and the sweep are counterfactual: they
are computed from the recorded correctness and estimated joules of every candidate on the served
queries; only the "served" line is what went through LiteLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from litellm_energy_router.knob import Knob
from litellm_energy_router.router.decide import DEFAULT_E_REF_J, decide


@dataclass
class Point:
    """One policy on the served queries: accuracy (mean score) and mean estimated J per query."""

    name: str
    accuracy: float
    energy_j: float
    candidate: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "accuracy": self.accuracy, "energy_j": self.energy_j, "candidate": self.candidate}


def _short(c: str) -> str:
    return c.split("/")[-1]


def baselines(Y: np.ndarray, E: np.ndarray, candidates: Sequence[str]) -> dict[str, Point]:
    """always-largest (most mean J), always-smallest (least), random (expected value), the best single
    candidate (most accurate; ties: cheaper) and the oracle (cheapest correct, needs hindsight)."""
    from litellm_energy_router.training.evaluate import oracle_choices

    acc, en = Y.mean(axis=0), E.mean(axis=0)
    big, small = int(np.argmax(en)), int(np.argmin(en))
    best = int(np.lexsort((en, -acc))[0])
    rows = np.arange(len(Y))
    orc = oracle_choices(Y, E)
    return {
        "always_largest": Point(
            f"always-largest ({_short(candidates[big])})", float(acc[big]), float(en[big]), candidates[big]
        ),
        "always_smallest": Point(
            f"always-smallest ({_short(candidates[small])})", float(acc[small]), float(en[small]), candidates[small]
        ),
        "random": Point("random candidate (expected)", float(acc.mean()), float(en.mean())),
        "best_single": Point(
            f"best single model ({_short(candidates[best])})", float(acc[best]), float(en[best]), candidates[best]
        ),
        "oracle": Point("oracle: cheapest correct (hindsight)", float(Y[rows, orc].mean()), float(E[rows, orc].mean())),
    }


@dataclass
class Sweep:
    """The router's λ sweep on the served queries (counterfactual, no exploration), with the AIQ of the
    router and of the static models' hull on each bootstrap resample of the queries (paired)."""

    evaluation: Any  # training.evaluate.Evaluation
    at_lambda: Point
    e_ref_j: float
    version: str
    aiq_boot: np.ndarray | None = None
    hull_boot: np.ndarray | None = None


def router_sweep(
    checkpoint: Path,
    texts: Sequence[str],
    prompt_tokens: Sequence[int],
    Y: np.ndarray,
    E: np.ndarray,
    lam: float,
    n_points: int = 41,
    n_boot: int = 500,
) -> Sweep:
    """Score the served queries with ``checkpoint`` as serving did (no task tag), sweep λ with the serving
    decision rule; ``Y``/``E`` in the checkpoint's candidate order. ``n_boot`` query resamples give the
    AIQ's spread (router and static hull on the same resample)."""
    from litellm_energy_router.router.scoring import load_scorer
    from litellm_energy_router.training.evaluate import aiq, bootstrap_rows, evaluate

    model = load_scorer(checkpoint)
    P = model.score(list(texts), None)
    Ehat = model.energy(list(texts), None, prompt_tokens=list(prompt_tokens))
    e_ref = DEFAULT_E_REF_J
    boot = bootstrap_rows(len(Y), n_boot) if n_boot else None
    ev = evaluate(Y, E, {"router": (P, Ehat)}, model.candidates, e_ref=e_ref, n_points=n_points, folds=boot)
    c = decide(P, Ehat, Knob.point(lambda_=lam, e_ref_j=e_ref))
    rows = np.arange(len(Y))
    at = Point(f"router at λ={lam:g}, no exploration", float(Y[rows, c].mean()), float(E[rows, c].mean()))
    hull = None
    if boot is not None:
        hull = np.array([aiq(E[i].mean(axis=0), Y[i].mean(axis=0), float(E[i].mean(axis=0).max())) for i in boot])
    return Sweep(ev, at, e_ref, model.version, np.asarray(ev.method("router").aiq_folds) if boot else None, hull)


@dataclass
class Headline:
    """The served traffic against the best single model (accuracy difference, joule ratio) and the
    router's λ sweep against the static models' hull (AIQ difference), each with a paired bootstrap 95 %
    interval over the served queries; a difference whose interval holds 0 (a ratio: 1) is a tie."""

    best: str
    acc_diff: float
    acc_ci: tuple[float, float]
    j_ratio: float
    j_ci: tuple[float, float]
    aiq_router: float
    aiq_hull: float
    aiq_ci: tuple[float, float] | None
    n_boot: int

    @classmethod
    def of(
        cls,
        prod: Sequence[dict[str, Any]],
        Y: np.ndarray,
        E: np.ndarray,
        base: dict[str, Point],
        sweep: Sweep,
        seed: int = 0,
    ) -> "Headline":
        """``prod``: the served production rows, row i = query i of ``Y``/``E`` (labelled, with energy)."""
        from litellm_energy_router.training.evaluate import bootstrap_rows, interval95

        b = list(sweep.evaluation.candidates).index(base["best_single"].candidate)
        s = np.array([r["score"] for r in prod], dtype=np.float64)
        j = np.array([r["energy_j"] for r in prod], dtype=np.float64)
        n_boot = len(sweep.aiq_boot) if sweep.aiq_boot is not None else 500
        idx = np.stack(bootstrap_rows(len(s), n_boot, seed + 1))
        d = s[idx].mean(axis=1) - Y[idx, b].mean(axis=1)
        r = j[idx].mean(axis=1) / E[idx, b].mean(axis=1)
        ev = sweep.evaluation
        a_r, a_h = ev.method("router").aiq, ev.method("zero router (static hull)").aiq
        a_ci = (
            interval95(sweep.aiq_boot - sweep.hull_boot)
            if sweep.aiq_boot is not None and sweep.hull_boot is not None
            else None
        )
        return cls(
            base["best_single"].name,
            float(s.mean() - Y[:, b].mean()),
            interval95(d),
            float(j.mean() / E[:, b].mean()),
            interval95(r),
            a_r,
            a_h,
            a_ci,
            n_boot,
        )

    def lines(self, served: Point, base: dict[str, Point]) -> list[str]:
        tie = lambda lo, hi, at: " (a tie: the interval holds " + at + ")" if lo <= float(at) <= hi else ""  # noqa: E731
        (alo, ahi), (jlo, jhi) = self.acc_ci, self.j_ci
        out = [
            f"headline (paired bootstrap 95% intervals over the {'served queries'}, {self.n_boot} resamples; J estimated):",
            f"  served traffic vs the {self.best}: accuracy {served.accuracy:.3f} vs {base['best_single'].accuracy:.3f} "
            f"({self.acc_diff:+.3f} [{alo:+.3f}, {ahi:+.3f}]{tie(alo, ahi, '0')}), J est. {served.energy_j:.2f} vs "
            f"{base['best_single'].energy_j:.2f} (x{self.j_ratio:.3f} [{jlo:.3f}, {jhi:.3f}]{tie(jlo, jhi, '1')})",
        ]
        if self.aiq_ci is not None:
            lo, hi = self.aiq_ci
            out.append(
                f"  router's λ sweep vs the static models' hull: AIQ {self.aiq_router:.4f} vs {self.aiq_hull:.4f} "
                f"({self.aiq_router - self.aiq_hull:+.4f} [{lo:+.4f}, {hi:+.4f}]{tie(lo, hi, '0')})"
            )
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "best_single": self.best,
            "accuracy_diff": self.acc_diff,
            "accuracy_diff_ci95": list(self.acc_ci),
            "joules_ratio": self.j_ratio,
            "joules_ratio_ci95": list(self.j_ci),
            "aiq_router": self.aiq_router,
            "aiq_static_hull": self.aiq_hull,
            "aiq_diff_ci95": None if self.aiq_ci is None else list(self.aiq_ci),
            "bootstrap_resamples": self.n_boot,
        }


def comparison_lines(
    served: Point, base: dict[str, Point], sweep: Sweep | None, n: int, lam: float, eps: float
) -> list[str]:
    """The comparison table as text lines, against the best single model (the baseline a deployment
    without a router would pick); every joule figure is marked as estimated."""
    ref = base["best_single"]
    points = (
        [served]
        + ([sweep.at_lambda] if sweep else [])
        + [base[k] for k in ("best_single", "always_largest", "always_smallest", "random", "oracle")]
    )
    w = max(len(p.name) for p in points) + 2
    lines = [
        f"{'policy'.ljust(w)}{'accuracy':>9}  {'vs best single':>14}  {'mean J/query (estimated)':>25}  {'J vs best single':>17}"
    ]
    for p in points:
        lines.append(
            f"{p.name.ljust(w)}{p.accuracy:9.3f}  {p.accuracy - ref.accuracy:>+14.3f}  {p.energy_j:>19.2f} J est.  "
            f"{(p.energy_j / ref.energy_j - 1) * 100:>+16.1f}%"
        )
    lines.append(
        f"(served: {n} held-back queries through litellm.Router, λ={lam:g}, ε={eps:g} exploration; accuracy = recorded "
        "correctness of the replayed answer; the other lines are counterfactual on the same queries)"
    )
    return lines


def sweep_lines(sweep: Sweep, candidates: Sequence[str], every: int = 5) -> list[str]:
    ev = sweep.evaluation
    r, z = ev.method("router"), ev.method("zero router (static hull)")
    c = r.curve
    lines = [
        f"router {sweep.version} λ sweep on the same queries (counterfactual; J estimated; e_ref {sweep.e_ref_j:.1f} J est.):",
        f"  {'λ':>8} {'accuracy':>9} {'mean J est.':>12}  most used",
    ]
    idx = sorted(set(list(range(0, len(c.knob), every)) + [len(c.knob) - 1]))
    for i in idx:
        j = int(np.argmax(c.shares[i]))
        lines.append(
            f"  {c.knob[i]:8.3g} {c.accuracy[i]:9.3f} {c.energy_j[i]:12.2f}  {_short(ev.candidates[j])} ({c.shares[i, j]:.0%})"
        )
    lines.append(
        f"  AIQ (area under the accuracy-vs-estimated-J hull / max J): router {r.aiq:.4f}, static models' hull {z.aiq:.4f}"
    )
    return lines


def write_plot(
    path: Path,
    served: Point,
    base: dict[str, Point],
    sweep: Sweep | None,
    Y: np.ndarray,
    E: np.ndarray,
    candidates: Sequence[str],
) -> Path:
    """``pareto.png``: static candidates and their hull, random, the oracle, the router's λ sweep and the
    served traffic; x axis = mean estimated J per query."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    se, sa = E.mean(axis=0), Y.mean(axis=0)
    fig, ax = plt.subplots(figsize=(12, 6))
    _plot_static(ax, candidates, se, sa)
    if sweep is not None:
        _plot_sweep(ax, sweep)
    _plot_references(ax, served, base)
    _label_axes(ax, served, se)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_static(ax: Any, candidates: Sequence[str], se: np.ndarray, sa: np.ndarray) -> None:
    """Each static candidate (mean estimated J ``se``, accuracy ``sa``) and the hull of them."""
    from litellm_energy_router.training.evaluate import pareto_hull

    markers = "osD^vP<>hX"
    for k, (c, x, y) in enumerate(zip(candidates, se, sa)):  # one legend entry per model: no labels to overlap
        ax.scatter(
            [x],
            [y],
            marker=markers[k % len(markers)],
            color="black",
            facecolor=f"C{k % 10}",
            s=60,
            zorder=5,
            label=f"always {_short(c)} ({y:.3f}, {x:.1f} J)",
        )
    hx, hy = pareto_hull(se, sa)
    ax.plot(np.r_[hx, se.max()], np.r_[hy, hy[-1]], "k--", lw=1, label="static models' hull")


def _plot_sweep(ax: Any, sweep: Sweep) -> None:
    """The router's λ sweep curve and its point at the served λ."""
    cv = sweep.evaluation.method("router").curve
    ax.plot(cv.energy_j, cv.accuracy, ".-", color="tab:blue", ms=4, lw=1, label=f"router λ sweep ({sweep.version})")
    ax.scatter(
        [sweep.at_lambda.energy_j],
        [sweep.at_lambda.accuracy],
        marker="o",
        facecolor="none",
        edgecolor="tab:blue",
        s=90,
        zorder=6,
        label=sweep.at_lambda.name,
    )


def _plot_references(ax: Any, served: Point, base: dict[str, Point]) -> None:
    """Random, the oracle and the served traffic."""
    r, o = base["random"], base["oracle"]
    ax.scatter([r.energy_j], [r.accuracy], marker="x", color="grey", s=70, label=r.name)
    ax.scatter([o.energy_j], [o.accuracy], marker="*", color="gold", edgecolor="k", s=160, label=o.name)
    ax.scatter(
        [served.energy_j],
        [served.accuracy],
        marker="*",
        color="tab:red",
        edgecolor="k",
        s=260,
        zorder=7,
        label=served.name,
    )


def _label_axes(ax: Any, served: Point, se: np.ndarray) -> None:
    """Axis labels (J marked as estimated), x range, title, legend beside the axes and grid."""
    ax.set_xlabel("mean energy per query, J (ESTIMATED: ML.ENERGY H100 profile x tokens)")
    ax.set_ylabel("accuracy (recorded correctness)")
    ax.set_xlim(0, max(float(se.max()), served.energy_j) * 1.08)
    ax.set_title("energy-router demo: served held-back traffic vs baselines")
    ax.legend(
        fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0
    )  # beside the axes, over no point
    ax.grid(alpha=0.3)


def served_point(rows: Sequence[dict[str, Any]], lam: float) -> Point:
    """The served traffic from its production rows: mean score and mean energy (J, estimated)."""
    scores = [r["score"] for r in rows if r["score"] is not None]
    energy = [r["energy_j"] for r in rows if r["energy_j"] is not None]
    if not scores or not energy:
        raise ValueError("no labelled production rows with energy to summarise")
    return Point(f"energy router, served (λ={lam:g})", float(np.mean(scores)), float(np.mean(energy)))
