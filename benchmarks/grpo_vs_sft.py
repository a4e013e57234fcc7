"""Does GRPO earn its place? The GRPO choice policy vs its SFT start vs the calibrated scorer, on CV folds.

    nice -n 10 python benchmarks/grpo_vs_sft.py [--folds 3] [--jobs 3] [--grpo-steps 60] [--beta 0.04] [--seed 0]

Folds: those of ``energy-router eval`` over the bundled development rows (by query, stratified by task,
near-duplicates in one fold). Per fold it trains one checkpoint with the GRPO stage on (``keep_start``,
so the SFT start is saved too) and judges three deciders on the held-out queries, each at the same λ
buckets (the checkpoint's, placed where its calibrated decision switches candidates):

* ``scorer``: the decision rule on the calibrated P (the LM scorer: probe + LM slope) and Ê;
* ``SFT start``: the choice policy after SFT on the scorer's decisions (its training queries);
* ``GRPO``: that policy after GRPO (reward correct − λ·J/100 J, KL-anchored to the start);

plus ``scorer (41-pt sweep)``, the scorer's full λ sweep (what ``energy-router eval`` reports). Per fold:
AIQ and joules at the best single model's accuracy (J at best; "never" when the hull stays below it).
Printed: mean ± std over folds, the served buckets (never-worse check on each checkpoint's calibration
queries), and last the GRPO − SFT AIQ difference with its fold spread.

Cost: the default backbone is too slow for several folds on 2 shared cores, so the backbone is the
``tiny`` one of ``TrainConfig.quick()`` (1 layer, 64 hidden, 512-token BPE), SFT 2 epochs at batch 16,
no student (the LM scorer is judged), the SFT start 1 epoch over (query, bucket) rows at batch 64, GRPO
60 steps (6 samples x 4 prompts); folds run in parallel processes, one torch thread each; the probe head (MiniLM embeddings) is the shipped one. The config is printed.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import tempfile
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from litellm_energy_router.training.backbones import BackboneSpec  # noqa: E402
from litellm_energy_router.training.crossval import routerbench_matrix  # noqa: E402
from litellm_energy_router.training.data import kfold, near_duplicate_groups  # noqa: E402
from litellm_energy_router.training.evaluate import Curve, aiq, joules_at_accuracy, sweep_lambda  # noqa: E402
from litellm_energy_router.training.grpo import GRPOStageConfig, choice_targets, policy_choices  # noqa: E402
from litellm_energy_router.training.pipeline import TrainConfig, train_matrix  # noqa: E402
from litellm_energy_router.training.sft import SFTStageConfig  # noqa: E402

from litellm_energy_router.router.decide import DEFAULT_E_REF_J  # noqa: E402
from litellm_energy_router.router.model import RouterModel  # noqa: E402
from litellm_energy_router.router.policy import START_FILE  # noqa: E402

METHODS = ("scorer (41-pt sweep)", "scorer", "SFT start", "GRPO")


def bench_config(args: argparse.Namespace) -> TrainConfig:
    """The cheap configuration this benchmark trains (documented above)."""
    grpo = GRPOStageConfig(
        steps=args.grpo_steps,
        beta=args.beta,
        start_epochs=args.start_epochs,
        start_batch_size=64,
        keep_start=True,
        seed=args.seed,
    )
    return TrainConfig(
        backbone=BackboneSpec(name="tiny", hidden_size=64, layers=1, vocab_size=512),
        sft=SFTStageConfig(epochs=2, batch_size=16, learning_rate=5e-3),
        max_len=64,
        student=False,
        grpo=grpo,
        seed=args.seed,
    )


def judge_fold(d: str, test) -> dict[str, tuple[float, float]]:
    """(AIQ, J at best) of each method on one fold's held-out queries, and the served buckets."""
    texts, tasks = list(test.texts), [str(t) for t in test.tasks]
    lm = RouterModel(d, scorer="lm")
    P, Eh = lm.score(texts, tasks), lm.energy(texts, tasks, prompt_tokens=list(test.prompt_tokens))
    g = lm.manifest.knob["grpo"]
    lams = [b["lambda"] for b in g["buckets"]]
    start = copy.deepcopy(lm.model)
    from safetensors.torch import load_model

    load_model(start, os.path.join(d, START_FILE))
    policy = copy.deepcopy(lm.model)
    load_model(policy, os.path.join(d, g["file"]))
    C = {
        "scorer": choice_targets(P, Eh, lams),
        "SFT start": policy_choices(start, lm.layout, texts, tasks, len(lams)),
        "GRPO": policy_choices(policy, lm.layout, texts, tasks, len(lams)),
    }
    C["scorer (41-pt sweep)"] = sweep_lambda(P, Eh, test.Y, test.E, DEFAULT_E_REF_J)[1]
    static_e, static_a = test.E.mean(axis=0), test.Y.mean(axis=0)
    x_max, best_acc = float(static_e.max()), float(static_a.max())
    out: dict = {}
    for name in METHODS:
        curve = Curve.from_choices(name, "lambda", np.arange(len(C[name])), C[name], test.Y, test.E)
        hx, hy = curve.hull()
        out[name] = (aiq(curve.energy_j, curve.accuracy, x_max), joules_at_accuracy(hx, hy, best_acc))
    out["agree"] = float((C["SFT start"] == C["scorer"]).mean())
    out["served"] = [b for b, e in enumerate(g["buckets"]) if e["served"]]
    out["lams"] = lams
    return out


def run_fold(job: tuple) -> dict:
    """Train one fold's checkpoint and judge it (a worker process of ``--jobs``)."""
    import torch

    f, train, test, cfg = job
    torch.set_num_threads(1)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="er-grpo-") as d:
        train_matrix(train, d, cfg, log=lambda s: print(f"  fold {f + 1}: {s}", flush=True))
        r = judge_fold(d, test)
    return {**r, "n_test": len(test), "secs": time.time() - t0}


def _ms(v: list[float]) -> str:
    f = [x for x in v if np.isfinite(x)]
    if not f:
        return "never"
    s = f"{np.mean(f):.4f} ± {np.std(f, ddof=1) if len(f) > 1 else 0.0:.4f}"
    return s + (f" ({len(v) - len(f)} never)" if len(f) < len(v) else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--grpo-steps", type=int, default=60)
    ap.add_argument("--beta", type=float, default=GRPOStageConfig.beta)
    ap.add_argument("--start-epochs", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=3, help="folds trained in parallel processes (1 torch thread each)")
    args = ap.parse_args()
    cfg = bench_config(args)
    print(f"config: {dataclasses.asdict(cfg)}; folds {args.folds}, jobs {args.jobs}", flush=True)
    m = routerbench_matrix()
    splits = kfold(near_duplicate_groups(m.texts, m.ids, m.tasks), args.folds, seed=args.seed, groups=m.tasks)
    t_all = time.time()
    jobs = [(f, m.subset(tr), m.subset(te), cfg) for f, (tr, te) in enumerate(splits)]
    if args.jobs > 1:  # one process per fold, one torch thread each (less contention than 2 threads each)
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(min(args.jobs, len(jobs))) as pool:
            res = pool.map(run_fold, jobs)
    else:
        res = [run_fold(j) for j in jobs]
    for f, r in enumerate(res):
        print(
            f"fold {f + 1}/{len(splits)}: {r['n_test']} held-out queries, {r['secs']:.0f} s; buckets λ "
            f"{np.round(r['lams'], 4).tolist()}; SFT start = scorer on {r['agree']:.1%} of held-out choices; "
            f"served buckets {r['served']}; AIQ " + ", ".join(f"{k} {r[k][0]:.4f}" for k in METHODS),
            flush=True,
        )
    print(f"\n{len(splits)} folds, {time.time() - t_all:.0f} s; mean ± std over folds")
    print(f"{'method':24s} {'AIQ':>18s} {'J at best acc':>22s}")
    for k in METHODS:
        print(f"{k:24s} {_ms([r[k][0] for r in res]):>18s} {_ms([r[k][1] for r in res]):>22s}")
    d_gs = [r["GRPO"][0] - r["SFT start"][0] for r in res]
    d_gc = [r["GRPO"][0] - r["scorer"][0] for r in res]
    print(f"GRPO - scorer (same buckets) AIQ: {np.mean(d_gc):+.4f} ± {np.std(d_gc, ddof=1):.4f} (fold std)")
    print(f"GRPO - SFT AIQ: {np.mean(d_gs):+.4f} ± {np.std(d_gs, ddof=1):.4f} (fold std, {len(res)} folds)")


if __name__ == "__main__":
    main()
