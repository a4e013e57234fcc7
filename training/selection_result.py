"""The result of model selection (:func:`~.selection.select`): one row per scorer judged on the CV folds
(:func:`scorer_rows`: AIQ ± fold sd, joules (J) at the best single candidate's accuracy and as a ratio to
its joules, Brier, fit seconds), the choice among them (:func:`choose`, a :class:`Selection`), and how it is
reported: the one-line verdict (:func:`selection_line`) and the markdown table of ``retrain``'s report and
``energy-router eval`` (:func:`summary_lines`, :func:`selection_table`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from .evaluate import Evaluation

if TYPE_CHECKING:
    from litellm_energy_router.plugins import ScorerSpec


@dataclass
class Selection:
    """The CV judgement of every scorer and the choice. ``rows``: one dict per selectable scorer."""

    ev: Evaluation
    rows: list[dict[str, Any]]
    chosen: str
    runner_up: str | None
    margin: float  # pooled AIQ of the chosen minus the runner-up's
    paired: tuple[float, float] | None  # mean and sd over folds of AIQ(chosen) − AIQ(runner-up)
    best_baseline: str | None
    folds: int
    stack_w: np.ndarray | None = None
    bases: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, Any] | None = None  # per-query energy: token errors per candidate, AIQ with that Ê

    @property
    def tie(self) -> bool:
        return self.paired is not None and abs(self.paired[0]) <= self.paired[1]

    def summary(self) -> dict[str, Any]:
        """JSON-able: what the report and the manifest's ``selection`` entry hold."""
        pm, ps = self.paired if self.paired else (None, None)
        return {
            "chosen": self.chosen,
            "runner_up": self.runner_up,
            "margin_aiq": self.margin,
            "paired_fold_delta_mean": pm,
            "paired_fold_delta_sd": ps,
            "tie": self.tie,
            "best_baseline": self.best_baseline,
            "folds": self.folds,
            "rule": "highest pooled held-out AIQ",
            "best_single": {
                "candidate": self.ev.candidates[self.ev.best],
                "accuracy": self.ev.best_accuracy,
                "joules": self.ev.best_energy,
            },
            "scorers": {r["scorer"]: {k: v for k, v in r.items() if k != "scorer"} for r in self.rows},
            "per_query_energy": self.tokens,
        }


def _fold_sd(v: Sequence[float]) -> float | None:
    v = [x for x in v if np.isfinite(x)]
    return float(np.std(v, ddof=1)) if len(v) > 1 else None


def scorer_rows(ev: Evaluation, names: Sequence[str], secs: Mapping[str, float]) -> list[dict[str, Any]]:
    """One row per scorer in ``names`` (:attr:`Selection.rows`): pooled AIQ and its sd over folds, joules (J)
    at the best single candidate's accuracy (None: never reached) and as a ratio to its joules (± fold sd),
    folds that never reach it, Brier score, fit seconds (``secs``)."""
    rows = []
    for n in names:
        r = ev.method(n)
        ratios = r.joules_ratio_folds
        rows.append(
            {
                "scorer": n,
                "aiq": r.aiq,
                "aiq_fold_sd": _fold_sd(r.aiq_folds),
                "joules_at_best": r.joules_at_best if np.isfinite(r.joules_at_best) else None,
                "joules_ratio": r.joules_at_best / ev.best_energy if np.isfinite(r.joules_at_best) else None,
                "joules_ratio_fold_sd": _fold_sd(ratios),
                "never_folds": int(sum(not np.isfinite(x) for x in ratios)),
                "brier": r.calibration.brier if r.calibration else None,
                "seconds": round(secs.get(n, 0.0), 1),
            }
        )
    return rows


def choose(
    ev: Evaluation,
    rows: list[dict[str, Any]],
    names: Sequence[str],
    known: Mapping[str, tuple[str, ScorerSpec]],
    folds: int,
    stack_w: np.ndarray | None,
    bases: list[str],
    seconds: dict[str, float],
    tokens: dict[str, Any] | None,
) -> Selection:
    """The :class:`Selection` of the judged ``rows`` (``known``: :func:`~.selection.selectable`): the highest
    pooled AIQ; then the fewest joules (J) at the best single candidate's accuracy; exact ties go to the
    cheaper scorer to serve (the registry's ``rank``). The runner-up, the margin and the best baseline too."""
    simple = {n: known[n][1].rank for n in names}
    ranked = sorted(
        rows,
        key=lambda r: (
            -r["aiq"],
            r["joules_at_best"] if r["joules_at_best"] is not None else np.inf,
            simple[r["scorer"]],
        ),
    )
    chosen = ranked[0]["scorer"]
    runner = ranked[1]["scorer"] if len(ranked) > 1 else None
    base_rows = [r for r in ranked if known[r["scorer"]][1].baseline]
    return Selection(
        ev,
        rows,
        chosen,
        runner,
        ranked[0]["aiq"] - (ranked[1]["aiq"] if runner else ranked[0]["aiq"]),
        ev.paired_fold_delta(chosen, runner) if runner else None,
        base_rows[0]["scorer"] if base_rows else None,
        folds,
        stack_w,
        bases,
        seconds,
        tokens,
    )


def selection_line(sel: Selection | dict[str, Any]) -> str:
    """One line: the choice, its margin over the runner-up and the spread of the paired fold differences."""
    s = sel.summary() if isinstance(sel, Selection) else sel
    if s["runner_up"] is None:
        return f"selection: {s['chosen']} (the only scorer)"
    pm, ps = s["paired_fold_delta_mean"], s["paired_fold_delta_sd"]
    verdict = "a tie (inside the fold spread)" if s["tie"] else "ahead beyond the fold spread"
    per_fold = "" if pm is None else f"; per fold {pm:+.4f} ± {ps:.4f}: {verdict}"
    return (
        f"selection: {s['chosen']} (AIQ {s['margin_aiq']:+.4f} over {s['runner_up']}{per_fold}) on {s['folds']}-fold CV"
    )


def summary_lines(s: dict[str, Any]) -> list[str]:
    """Markdown of a :meth:`Selection.summary`: per scorer AIQ ± fold sd, joules at the best single's
    accuracy (J, and × its J ± fold sd), Brier and fit seconds; the one retrain (select: true) promotes is marked."""
    b = s["best_single"]
    lines = [
        f"| scorer | AIQ ± fold sd | J at {b['candidate']}'s accuracy ({b['accuracy']:.3f}) | × its J "
        f"({b['joules']:.1f} J) ± fold sd | Brier | fit s |",
        "|---|---|---|---|---|---|",
    ]
    sd = lambda v, f: "–" if v is None else f"{v:{f}}"  # noqa: E731
    for name, r in sorted(s["scorers"].items(), key=lambda kv: -kv[1]["aiq"]):
        mark = " **← promoted**" if name == s["chosen"] else ""
        j = "never" if r["joules_at_best"] is None else f"{r['joules_at_best']:.2f}"
        ratio = (
            "never"
            if r["joules_ratio"] is None
            else f"{r['joules_ratio']:.3f} ± {sd(r['joules_ratio_fold_sd'], '.3f')}"
        )
        lines.append(
            f"| {name}{mark} | {r['aiq']:.4f} ± {sd(r['aiq_fold_sd'], '.4f')} | {j} | {ratio} | "
            f"{sd(r['brier'], '.4f')} | {r['seconds']:.0f} |"
        )
    lines += ["", selection_line(s)]
    tok = s.get("per_query_energy")
    if tok:
        lines += [
            "",
            "Per-query energy (output tokens predicted per query and candidate, same folds): output-token "
            "MAE per candidate, per-task mean → model: "
            + ", ".join(
                f"{c.split('/')[-1]} {e['mae_task_mean']:.1f} → {e['mae_model']:.1f}"
                for c, e in tok["token_mae"].items()
                if e["mae_task_mean"] is not None
            )
            + "; AIQ with it (paired per-fold Δ vs the per-task Ê): "
            + ", ".join(
                f"{n} {r['aiq']:.4f} ({r['aiq_delta_fold_mean']:+.4f} ± {r['aiq_delta_fold_sd'] or 0:.4f})"
                for n, r in tok["scorers"].items()
            )
            + ("" if "served" not in tok else f"; served: {'yes' if tok['served'] else 'no'}")
            + ".",
        ]
    return lines


def selection_table(sel: Selection) -> str:
    return "\n".join(summary_lines(sel.summary()))
