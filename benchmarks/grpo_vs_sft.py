"""Does the GRPO stage improve the held-out curve over SFT alone? Same folds as ``energy-router eval``.

    python benchmarks/grpo_vs_sft.py [--folds 5] [--run-folds 1] [--grpo-steps 200] [--seed 0] [--quick]

Per fold run it trains the router twice with the defaults of ``energy-router train`` (same seed, same
split): once as shipped (SFT, GRPO off) and once with ``GRPOStageConfig(steps=--grpo-steps)`` after SFT. It
scores the held-out queries of that fold, with each checkpoint's own Ê:

* ``LM scorer``: the shipped head (probe + LM slope) over the checkpoint's slot logits;
* ``LM + Platt``: the LM's slot logits alone, per-task Platt intercepts on the checkpoint's calibration
  queries (where a change of the LM's weights by GRPO shows undiluted by the probe);
* ``GRPO policy`` (GRPO checkpoint only): the λ-conditioned choice policy itself, its argmax label per
  λ bucket, one operating point per bucket (the curve GRPO optimises directly).

Prints AIQ, joules at the most accurate single candidate's accuracy and accuracy at half its joules on
the held-out queries of the folds run, and each training's wall time per fold.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ablate_head import lm_platt_scores  # noqa: E402  (this folder is on sys.path when run as a script)
from litellm_energy_router.router.decide import DEFAULT_E_REF_J  # noqa: E402
from litellm_energy_router.router.model import RouterModel  # noqa: E402
from litellm_energy_router.training.baselines import task_prior  # noqa: E402
from litellm_energy_router.training.crossval import routerbench_matrix  # noqa: E402
from litellm_energy_router.training.data import kfold, near_duplicate_groups  # noqa: E402
from litellm_energy_router.training.evaluate import Curve, aiq, evaluate, hull_value, joules_at_accuracy  # noqa: E402
from litellm_energy_router.training.grpo import GRPOStageConfig, choice_logits  # noqa: E402
from litellm_energy_router.training.pipeline import TrainConfig, train_matrix  # noqa: E402


def _heads(d: str, train, test, cfg: TrainConfig) -> tuple[RouterModel, np.ndarray, np.ndarray]:
    """(LM-scorer model, P of the shipped head, P of the LM alone with per-task Platt) on ``test``."""
    texts, tasks = list(test.texts), [str(t) for t in test.tasks]
    lm = RouterModel(d, scorer="lm")
    return lm, lm.score(texts, tasks), lm_platt_scores(lm, train, cfg, texts, tasks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--run-folds", type=int, default=1, help="how many of the folds to run (from fold 0)")
    ap.add_argument("--grpo-steps", type=int, default=GRPOStageConfig.steps)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="TrainConfig.quick() instead of the defaults (a smoke run)")
    args = ap.parse_args()
    m = routerbench_matrix()
    splits = kfold(near_duplicate_groups(m.texts, m.ids, m.tasks), args.folds, seed=args.seed, groups=m.tasks)
    splits = splits[: args.run_folds]
    rows = np.concatenate([te for _, te in splits])
    names = ("SFT: LM scorer", "SFT+GRPO: LM scorer", "SFT: LM + Platt", "SFT+GRPO: LM + Platt", "task prior")
    P = {k: np.full((m.n, m.K), np.nan) for k in names}
    Eh = np.full((m.n, m.K), np.nan)
    policy_choices: list[np.ndarray] = []  # per fold: [buckets, n_test]
    e_refs, secs = [], {"SFT": 0.0, "SFT+GRPO": 0.0}
    for f, (tr, te) in enumerate(splits):
        train, test = m.subset(tr), m.subset(te)
        texts, tasks = list(test.texts), [str(t) for t in test.tasks]
        sft_cfg = TrainConfig.quick() if args.quick else TrainConfig()
        grpo_cfg = dataclasses.replace(sft_cfg, grpo=GRPOStageConfig(steps=args.grpo_steps))
        with tempfile.TemporaryDirectory(prefix="er-grpo-") as d1, tempfile.TemporaryDirectory(prefix="er-grpo-") as d2:
            t0 = time.time()
            train_matrix(train, d1, sft_cfg, log=lambda s: None)
            t1 = time.time()
            train_matrix(train, d2, grpo_cfg, log=lambda s: None)
            secs["SFT"] += t1 - t0
            secs["SFT+GRPO"] += time.time() - t1
            lm, P["SFT: LM scorer"][te], P["SFT: LM + Platt"][te] = _heads(d1, train, test, sft_cfg)
            lm2, P["SFT+GRPO: LM scorer"][te], P["SFT+GRPO: LM + Platt"][te] = _heads(d2, train, test, grpo_cfg)
            buckets = lm2.manifest.knob["grpo_lambda_buckets"]
            policy_choices.append(np.stack([choice_logits(lm2.model, lm2.layout, texts, tasks, b).argmax(axis=1)
                                            for b in range(len(buckets))]))  # fmt: skip
            P["task prior"][te] = task_prior(train, tasks)
            Eh[te] = lm.energy(texts, tasks, prompt_tokens=list(test.prompt_tokens))
            e_refs.append(DEFAULT_E_REF_J)
        print(f"fold {f + 1}/{len(splits)}: {time.time() - t0:.0f} s", flush=True)
    Y, E = m.Y[rows], m.E[rows]
    ev = evaluate(Y, E, {k: (P[k][rows], Eh[rows]) for k in names}, m.candidates, e_ref=float(np.mean(e_refs)))
    print(f"{len(rows)} held-out queries ({len(splits)} of {args.folds} folds); GRPO {args.grpo_steps} steps; "
          f"train per fold: SFT {secs['SFT'] / len(splits):.0f} s, SFT+GRPO {secs['SFT+GRPO'] / len(splits):.0f} s")  # fmt: skip
    print(f"{'method':24s} {'AIQ':>7s} {'J at best acc':>14s} {'acc at half J':>14s}")
    for r in ev.methods:
        if r.kind == "router":
            print(f"{r.name:24s} {r.aiq:7.4f} {r.joules_at_best:14.2f} {r.acc_at_half:14.3f}")
    # the policy's own operating points: one per λ bucket, pooled over the folds run
    C = np.concatenate(policy_choices, axis=1)
    curve = Curve.from_choices("GRPO policy", "lambda", np.arange(C.shape[0]), C, Y, E)
    hx, hy = curve.hull()
    print(f"{'GRPO policy':24s} {aiq(curve.energy_j, curve.accuracy, ev.x_max):7.4f} "
          f"{joules_at_accuracy(hx, hy, ev.best_accuracy):14.2f} {hull_value(hx, hy, ev.best_energy / 2):14.3f}")  # fmt: skip
    for b in range(C.shape[0]):
        share = np.bincount(C[b], minlength=m.K) / C.shape[1]
        print(f"  bucket {b}: accuracy {curve.accuracy[b]:.3f}, {curve.energy_j[b]:.2f} J, most chosen "
              f"{m.candidates[int(share.argmax())]} ({share.max():.0%})")  # fmt: skip


if __name__ == "__main__":
    main()
