"""Learned baselines on the bundled RouterBench development rows, 5-fold cross-validation by query.

    python benchmarks/bench_baselines.py [--folds 5] [--methods task_prior,knn,logreg,mf] [--out DIR]

The rows (6 open models; energy = the bundled ML.ENERGY profile applied to RouterBench's token counts)
are imported into a temporary SQLite table and read back through it. Per method: AIQ, the joules needed
to reach the best single model's (Yi-34B's) pooled accuracy and the saving vs Yi's mean J, and the
accuracy at half Yi's joules; plus the zero router (static hull), random and the oracle.
Hyperparameters are tuned by inner CV on training folds only. Query embeddings (MiniLM) are cached
under $XDG_CACHE_HOME/litellm-energy-router (first run: a few minutes on 2 cores to embed 2,217 queries).

Last line: ``aiq <method>=<value> ...`` for every method and reference point.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from litellm_energy_router.training.crossval import baseline_factories, cross_validate, routerbench_matrix  # noqa: E402
from litellm_energy_router.training.evaluate import Evaluation  # noqa: E402
from litellm_energy_router.training.report import (
    paired_lines,  # noqa: E402
    write_report,  # noqa: E402
)


def print_table(ev: Evaluation, file=sys.stdout) -> None:
    best = ev.candidates[ev.best].split("/")[-1]
    print(
        f"{ev.n} queries x {len(ev.candidates)} candidates, {ev.n_folds}-fold CV by query; "
        f"best single: {best} acc {ev.best_accuracy:.4f} at {ev.best_energy:.2f} J; x_max {ev.x_max:.2f} J",
        file=file,
    )
    hdr = f"{'method':28s} {'AIQ':>7s} {'fold mean±sd':>14s} {'J@' + best + ' acc':>16s} {'saving':>8s} {'acc@½J':>7s} {'phase λ':>8s}"
    print(hdr, file=file)
    print("-" * len(hdr), file=file)
    for r in ev.rows():
        fold = f"{r['aiq_fold_mean']:.4f}±{r['aiq_fold_sd']:.4f}" if r["aiq_fold_sd"] is not None else "-"
        j = "never" if r["joules_at_best"] == float("inf") else f"{r['joules_at_best']:.2f}"
        sav = f"{r['savings_pct']:.1f}%" if r["savings_pct"] is not None else "-"
        ph = f"{r['phase_lambda']:.3g}" if r["phase_lambda"] is not None else "-"
        print(
            f"{r['method']:28s} {r['aiq']:7.4f} {fold:>14s} {j:>16s} {sav:>8s} {r['acc_at_half']:7.4f} {ph:>8s}",
            file=file,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default=",".join(baseline_factories()), help="comma-separated baseline names")
    ap.add_argument("--out", default=None, help="also write report.md, pareto.png, phase.png, curves.csv here")
    a = ap.parse_args()
    t0 = time.perf_counter()
    m = routerbench_matrix()
    print(m.summary())
    ev = cross_validate(
        baseline_factories(a.methods.split(",")),
        m,
        folds=a.folds,
        seed=a.seed,
        progress=lambda i, n, s: print(f"[{i + 1}/{n}] {s}", file=sys.stderr, flush=True),
    )
    print_table(ev)
    for n in paired_lines(ev) + ev.notes:
        print("note:", n)
    if a.out:
        paths = write_report(ev, a.out, title=f"Baselines, RouterBench development rows, {a.folds}-fold CV")
        print("wrote", ", ".join(str(p) for p in paths.values()))
    print(f"total {time.perf_counter() - t0:.0f} s")
    print("aiq " + " ".join(f"{r['method'].split(' ')[0]}={r['aiq']:.4f}" for r in ev.rows()))


if __name__ == "__main__":
    main()
