"""Output-token error of the per-query token model against the per-task mean, 5-fold CV.

    python benchmarks/token_errors.py --db sqlite:///rb.db

Prints per candidate the MAE and RMSE (tokens) of both on all rows, then on each task whose output lengths
vary (training.token_fit.token_errors on training.crossval.cv_splits).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from litellm_energy_router.training.crossval import cv_splits
from litellm_energy_router.training.data import load_matrix
from litellm_energy_router.training.token_fit import token_errors

from litellm_energy_router.table import open_store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--folds", type=int, default=5)
    a = ap.parse_args()
    store = open_store(a.db)
    m = load_matrix(store)
    store.close()
    parts = [("all rows", m)] + [
        (t, m.subset(np.flatnonzero(m.tasks == t)))
        for t in m.task_names()
        if np.nanstd(m.T[m.tasks == t], axis=0).max() >= 1.0
    ]
    for name, sub in parts:
        t0 = time.time()
        errs, _ = token_errors(sub, cv_splits(sub, a.folds, 0))
        print(f"\n{name} ({sub.n} queries, {time.time() - t0:.0f} s): MAE / RMSE, per-task mean -> model")
        for c, e in errs.items():
            print(
                f"  {c}: MAE {e['mae_task_mean']:.1f} -> {e['mae_model']:.1f}, RMSE {e['rmse_task_mean']:.1f} -> {e['rmse_model']:.1f}"
            )


if __name__ == "__main__":
    main()
