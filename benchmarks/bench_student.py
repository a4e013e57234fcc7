"""Fidelity of the distilled student to the router it was distilled from, on one cross-validation fold.

    python benchmarks/bench_student.py [--checkpoint DIR] [--fold 0]

Trains the router with the defaults of ``energy-router train`` on the training part of one fold of the
``energy-router eval`` split of the bundled RouterBench rows (or loads ``--checkpoint``, trained on that
same part) and compares its two scorers on the held-out queries, with the task shown and hidden (serving
scores production traffic without a task): ``router.scorer: lm`` (LM + probe head, the reference) and the
serving student: mean |ΔP|, decision agreement at λ over the checkpoint's knob range, and the AIQ of each
(λ sweep, same Ê).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from litellm_energy_router.training.crossval import routerbench_matrix  # noqa: E402
from litellm_energy_router.training.data import kfold, near_duplicate_groups  # noqa: E402
from litellm_energy_router.training.evaluate import aiq, sweep_lambda  # noqa: E402
from litellm_energy_router.training.pipeline import TrainConfig, train_matrix  # noqa: E402

from litellm_energy_router.router.decide import DEFAULT_E_REF_J, decide_lambda, knob_sweep  # noqa: E402
from litellm_energy_router.router.model import RouterModel  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint")
    ap.add_argument("--fold", type=int, default=0)
    args = ap.parse_args()
    m = routerbench_matrix()
    tr, te = kfold(near_duplicate_groups(m.texts, m.ids, m.tasks), 5, seed=0, groups=m.tasks)[args.fold]
    train, test = m.subset(tr), m.subset(te)
    ck = args.checkpoint
    if ck is None:
        ck = tempfile.mkdtemp(prefix="er-student-")
        t0 = time.time()
        train_matrix(train, ck, TrainConfig(), log=lambda s: None)
        print(f"trained the router on {train.n} queries in {time.time() - t0:.0f} s")
    lm, st = RouterModel(ck, scorer="lm"), RouterModel(ck)
    if st.student is None:
        raise SystemExit(f"{ck}: the checkpoint ships no student")
    tasks_te = [str(t) for t in test.tasks]
    Eh = lm.energy(test.texts, tasks_te, prompt_tokens=list(test.prompt_tokens))
    e_ref, x_max = DEFAULT_E_REF_J, float(test.E.mean(axis=0).max())
    lams = knob_sweep(lm.manifest.knob, 6)
    print(f"fold {args.fold}: {test.n} held-out queries; λ = {np.round(lams, 4).tolist()}")
    for label, tk in (("task shown", tasks_te), ("task hidden", [None] * test.n)):
        P_lm, P_st = lm.score(test.texts, tk), st.score(test.texts, tk)
        agree = [
            float((decide_lambda(P_st, Eh, lam, e_ref) == decide_lambda(P_lm, Eh, lam, e_ref)).mean()) for lam in lams
        ]
        a_lm = aiq(*(lambda c: (c.energy_j, c.accuracy))(sweep_lambda(P_lm, Eh, test.Y, test.E, e_ref)[0]), x_max)
        a_st = aiq(*(lambda c: (c.energy_j, c.accuracy))(sweep_lambda(P_st, Eh, test.Y, test.E, e_ref)[0]), x_max)
        print(
            f"{label}: mean |ΔP| {np.abs(P_st - P_lm).mean():.4f}; decision agreement {[round(a, 3) for a in agree]}; "
            f"AIQ student {a_st:.4f} vs LM {a_lm:.4f} (Δ {a_st - a_lm:+.4f})"
        )


if __name__ == "__main__":
    main()
