"""Writers for an :class:`~.evaluate.Evaluation`: ``report.md``, ``pareto.png``, ``phase.png``, ``curves.csv``.

matplotlib is imported here, with the Agg backend (no display needed).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np

from .evaluate import Evaluation, MethodResult

DEFINITIONS = """\
Definitions. Energy is the mean true joules per query (J), accuracy the mean score. The zero router is
the non-decreasing concave hull of the always-one-candidate points; random sends each query to a uniformly
drawn candidate; the oracle sends each query to the cheapest candidate with the best score (its curve: the
decision rule swept with the true outcomes and joules, an upper bound for every router). AIQ = area
under a curve's non-decreasing concave hull over [0, x_max] / x_max (0 below its cheapest point, flat
after its last), x_max = the largest always-one-candidate mean J. "J at best acc" = the J a hull needs to
reach the most accurate single candidate's pooled accuracy (savings vs that candidate's J); "acc at half J"
= the hull's accuracy at half that candidate's J. Phase λ = where the share sent to the large candidates
(mean J above the pool median) crosses 50 %; width = log10 of the λ ratio between its 75 % and 25 % crossings.
Learned routers are swept over λ with the serving decision rule (argmax P_j − λ·Ê_j/e_ref)."""


def _f(v: Any, spec: str = ".3f", none: str = "–") -> str:
    if v is None:
        return none
    if isinstance(v, float) and math.isinf(v):
        return "never"
    return format(v, spec)


def summary_table(ev: Evaluation) -> str:
    """The per-method table as markdown."""
    best = ev.candidates[ev.best]
    head = (
        "| method | AIQ | AIQ per fold (mean ± sd) | AIQ (target mode) | max acc | "
        f"J at best acc ({best} {ev.best_accuracy:.3f}) | savings vs {ev.best_energy:.1f} J | acc at half J | phase λ | width (dec) |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in ev.rows():
        fold = f"{r['aiq_fold_mean']:.3f} ± {r['aiq_fold_sd']:.3f}" if r["aiq_fold_sd"] is not None else "–"
        sav = f"{r['savings_pct']:.1f} %" if r["savings_pct"] is not None else "–"
        lines.append(
            f"| {r['method']} | {r['aiq']:.4f} | {fold} | {_f(r['aiq_target'], '.4f')} | {r['max_accuracy']:.3f} | "
            f"{_f(r['joules_at_best'], '.2f')} | {sav} | {r['acc_at_half']:.3f} | {_f(r['phase_lambda'], '.3g')} | "
            f"{_f(r['phase_width_decades'], '.2f')} |"
        )
    return "\n".join(lines)


def paired_lines(ev: Evaluation, reference: str = "task_prior") -> list[str]:
    """Per-fold paired AIQ differences of every router against ``reference`` (same test folds)."""
    names = [m.name for m in ev.methods if m.kind == "router"]
    if reference not in names:
        return []
    out = []
    for n in names:
        d = ev.paired_fold_delta(n, reference) if n != reference else None
        if d is not None:
            out.append(
                f"AIQ({n}) − AIQ({reference}) per fold: {d[0]:+.4f} ± {d[1]:.4f} (mean ± sd over {len(ev.method(n).aiq_folds)} folds)"
            )
    return out


def calibration_tables(ev: Evaluation) -> str:
    """Brier score, ECE and the reliability table (mean predicted P → observed success, per P bin) of
    every router's predicted P, each (query, candidate) pair one forecast."""
    rs = [m for m in _routers(ev) if m.calibration is not None]
    if not rs:
        return ""
    lines = ["| method | Brier | ECE |", "|---|---|---|"]
    lines += [f"| {m.name} | {m.calibration.brier:.4f} | {m.calibration.ece:.4f} |" for m in rs]
    edges = sorted({(lo, hi) for m in rs for lo, hi, *_ in m.calibration.bins})
    lines += [
        "",
        "Reliability: mean predicted P → observed success (pairs) per bin of P.",
        "",
        "| P bin | " + " | ".join(m.name for m in rs) + " |",
        "|" + "---|" * (len(rs) + 1),
    ]
    by_edge = [{(lo, hi): (n, mp, obs) for lo, hi, n, mp, obs in m.calibration.bins} for m in rs]
    for lo, hi in edges:
        cells = [f"{c[1]:.2f} → {c[2]:.2f} ({c[0]})" if (c := bins.get((lo, hi))) else "–" for bins in by_edge]
        lines.append(f"| {lo:.1f}–{hi:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def static_table(ev: Evaluation) -> str:
    lines = ["| candidate | accuracy | mean J |", "|---|---|---|"]
    for c, a, e in zip(ev.candidates, ev.static_accuracy, ev.static_energy):
        lines.append(f"| {c} | {a:.3f} | {e:.2f} |")
    return "\n".join(lines)


def write_markdown(ev: Evaluation, path: Path, title: str, extra: str = "") -> None:
    folds = f", {ev.n_folds}-fold cross-validation by query (predictions pooled over test folds)" if ev.n_folds else ""
    parts = [
        f"# {title}",
        "",
        f"{ev.n} held-out queries × {len(ev.candidates)} candidates{folds}. x_max = {ev.x_max:.2f} J.",
        "",
        "## Methods",
        "",
        summary_table(ev),
        "",
        "## Always one candidate",
        "",
        static_table(ev),
        "",
        *(["## Calibration of the predicted P", "", cal, ""] if (cal := calibration_tables(ev)) else []),
        "![pareto](pareto.png)",
        "",
        "![phase](phase.png)",
        "",
        DEFINITIONS,
        "",
    ]
    notes = paired_lines(ev) + ev.notes
    if notes:
        parts += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    if extra:
        parts += [extra, ""]
    path.write_text("\n".join(parts))


def _routers(ev: Evaluation) -> list[MethodResult]:
    return [m for m in ev.methods if m.kind == "router"]


def write_csv(ev: Evaluation, path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "mode", "knob", "energy_j", "accuracy"] + [f"share:{c}" for c in ev.candidates])
        for m in ev.methods:
            for c in [m.curve] + ([m.target_curve] if m.target_curve is not None else []):
                for i in range(len(c.energy_j)):
                    w.writerow(
                        [m.name, c.mode, f"{c.knob[i]:.6g}", f"{c.energy_j[i]:.6f}", f"{c.accuracy[i]:.6f}"]
                        + [f"{s:.6f}" for s in c.shares[i]]
                    )


def _short(name: str) -> str:
    return name.split("/")[-1]


def write_pareto(ev: Evaluation, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 6))
    ax.scatter(ev.static_energy, ev.static_accuracy, color="black", zorder=5, label="always one candidate")
    for c, x, y in zip(ev.candidates, ev.static_energy, ev.static_accuracy):
        ax.annotate(_short(c), (x, y), textcoords="offset points", xytext=(4, -10), fontsize=8)

    def hull_line(m: MethodResult) -> tuple[np.ndarray, np.ndarray]:
        hx, hy = m.curve.hull()
        return np.concatenate([hx, [ev.x_max]]), np.concatenate([hy, [hy[-1]]])

    for m in ev.methods:
        if m.kind == "zero":
            ax.plot(*hull_line(m), "k--", lw=1, label=f"zero router (AIQ {m.aiq:.3f})")
        elif m.kind == "random":
            ax.scatter(
                m.curve.energy_j, m.curve.accuracy, marker="x", color="grey", s=60, label=f"random (AIQ {m.aiq:.3f})"
            )
        elif m.kind == "oracle":
            ax.plot(*hull_line(m), "-", color="goldenrod", lw=1, label=f"oracle (AIQ {m.aiq:.3f})")
            ax.scatter(
                m.curve.energy_j[:1],
                m.curve.accuracy[:1],
                marker="*",
                color="gold",
                edgecolor="k",
                s=160,
                label="oracle: cheapest correct",
                zorder=6,
            )
    for m in _routers(ev):
        (line,) = ax.plot(m.curve.energy_j, m.curve.accuracy, ".", ms=4, alpha=0.6)
        ax.plot(*hull_line(m), "-", lw=1.5, color=line.get_color(), label=f"{m.name} (AIQ {m.aiq:.3f})")
    ax.axhline(ev.best_accuracy, color="grey", lw=0.6, ls=":")
    ax.axvline(ev.best_energy / 2, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("mean energy per query (J)")
    ax.set_ylabel("accuracy")
    ax.set_xlim(0, ev.x_max * 1.05)
    ax.set_title("accuracy vs energy (dots: operating points; lines: hulls)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_phase(ev: Evaluation, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routers = _routers(ev)
    n = max(len(routers), 1)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.ravel()[len(routers) :]:
        ax.axis("off")
    for ax, m in zip(axes.ravel(), routers):
        c = m.curve
        lam = c.knob
        pos = lam[lam > 0]
        lin = float(pos.min()) if pos.size else 1.0
        ax.stackplot(lam, c.shares.T, labels=[_short(x) for x in ev.candidates], alpha=0.85)
        ax.set_xscale("symlog", linthresh=lin)
        if m.phase and m.phase.lam50 is not None:
            ax.axvline(m.phase.lam50, color="k", lw=1, ls="--")
        ax.set_title(f"{m.name}: phase λ={_f(m.phase.lam50 if m.phase else None, '.3g')}", fontsize=9)
        ax.set_xlabel("λ (energy weight, unit-free)")
        ax.set_ylabel("routing share")
        ax.set_ylim(0, 1)
    if routers:
        fig.legend(
            *axes.ravel()[0].get_legend_handles_labels(),
            fontsize=8,
            loc="lower center",
            ncol=min(len(ev.candidates), 6),
        )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(
    ev: Evaluation, out_dir: str | Path, *, title: str = "Router evaluation", extra: str = ""
) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / k for k in ("report.md", "pareto.png", "phase.png", "curves.csv")}
    write_markdown(ev, paths["report.md"], title, extra)
    write_csv(ev, paths["curves.csv"])
    write_pareto(ev, paths["pareto.png"])
    write_phase(ev, paths["phase.png"])
    return paths


def write_report(ev: Evaluation, out_dir, *, title: str = "Router evaluation", extra: str = "") -> dict:
    """Write ``report.md``, ``pareto.png``, ``phase.png`` and ``curves.csv`` into ``out_dir``; returns the paths."""
    return write_all(ev, out_dir, title=title, extra=extra)
