"""Where the router's curve comes from: the parts of its scoring head, judged on the same folds.

    python benchmarks/ablate_head.py [--folds 5] [--seed 0]

Uses the split of ``energy-router eval`` (by query, stratified by task, near-duplicates in one fold). Per
fold it trains the router once with the defaults of ``energy-router train`` and scores the held-out
queries five ways, all with the checkpoint's own Ê:

* ``shipped (LM scorer)``: the checkpoint as ``router.scorer: lm`` serves it, probe head + LM slope;
* ``shipped (student)``: the serving student;
* ``LM + Platt``: the same SFT model's slot logits with per-task Platt intercepts fitted on the
  checkpoint's calibration queries (the head of ``TrainConfig(probe_c=None)``);
* ``probe only``: the shipped probe head without the LM;
* ``task prior``: each candidate's accuracy per task on the training queries.

Prints AIQ, joules at the most accurate single candidate's accuracy and accuracy at half its joules,
pooled over the folds, and the per-fold AIQ.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from litellm_energy_router.training.baselines import task_prior  # noqa: E402
from litellm_energy_router.training.calibrate import fit_calibration  # noqa: E402
from litellm_energy_router.training.crossval import routerbench_matrix  # noqa: E402
from litellm_energy_router.training.data import kfold, near_duplicate_groups  # noqa: E402
from litellm_energy_router.training.evaluate import evaluate  # noqa: E402
from litellm_energy_router.training.pipeline import TrainConfig, calibration_split, train_matrix  # noqa: E402

from litellm_energy_router.router.decide import DEFAULT_E_REF_J  # noqa: E402
from litellm_energy_router.router.format import UNKNOWN_TASK  # noqa: E402
from litellm_energy_router.router.model import RouterModel  # noqa: E402
from litellm_energy_router.router.scoring import scores_from_logits  # noqa: E402

METHODS = ("shipped (LM scorer)", "shipped (student)", "LM + Platt", "probe only", "task prior")


def lm_platt_scores(lm: RouterModel, train, cfg: TrainConfig, texts: list[str], tasks: list[str]) -> np.ndarray:
    """P[n, K] of the checkpoint's LM alone: its slot logits with per-task Platt intercepts fitted on the
    checkpoint's calibration queries (the head of ``TrainConfig(probe_c=None)``)."""
    _, cal_idx = calibration_split(train, cfg.calib_fraction, cfg.seed)
    cal = train.take(cal_idx)
    z_cal = lm.slot_logits(list(cal.texts), [str(t) for t in cal.tasks])
    z_any = lm.slot_logits(list(cal.texts), [UNKNOWN_TASK] * cal.n)
    platt = fit_calibration(z_cal, z_any, cal.Y, [str(t) for t in cal.tasks])
    return scores_from_logits(lm.slot_logits(texts, tasks), platt, tasks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    m = routerbench_matrix()
    splits = kfold(near_duplicate_groups(m.texts, m.ids, m.tasks), args.folds, seed=args.seed, groups=m.tasks)
    P = {k: np.full((m.n, m.K), np.nan) for k in METHODS}
    Eh = np.full((m.n, m.K), np.nan)
    e_refs = []
    cfg = TrainConfig()
    for f, (tr, te) in enumerate(splits):
        t0 = time.time()
        train, test = m.subset(tr), m.subset(te)
        texts, tasks = list(test.texts), [str(t) for t in test.tasks]
        with tempfile.TemporaryDirectory(prefix="er-ablate-") as d:
            train_matrix(train, d, cfg, log=lambda s: None)
            lm, student = RouterModel(d, scorer="lm"), RouterModel(d)
            P["shipped (LM scorer)"][te] = lm.score(texts, tasks)
            P["shipped (student)"][te] = student.score(texts, tasks)
            P["LM + Platt"][te] = lm_platt_scores(lm, train, cfg, texts, tasks)
            P["probe only"][te] = 1.0 / (1.0 + np.exp(-lm.probe_logits(texts, tasks)))
            P["task prior"][te] = task_prior(train, tasks)
            Eh[te] = lm.energy(texts, tasks, prompt_tokens=list(test.prompt_tokens))
            e_refs.append(DEFAULT_E_REF_J)
        print(f"fold {f + 1}/{len(splits)}: {time.time() - t0:.0f} s", flush=True)
    ev = evaluate(
        m.Y,
        m.E,
        {k: (P[k], Eh) for k in METHODS},
        m.candidates,
        e_ref=float(np.mean(e_refs)),
        folds=[te for _, te in splits],
    )
    print(f"{'method':22s} {'AIQ':>7s} {'J at best acc':>14s} {'acc at half J':>14s}  AIQ per fold")
    for r in ev.methods:
        if r.kind == "router":
            folds = " ".join(f"{a:.4f}" for a in r.aiq_folds)
            print(f"{r.name:22s} {r.aiq:7.4f} {r.joules_at_best:14.2f} {r.acc_at_half:14.3f}  {folds}")


if __name__ == "__main__":
    main()
