"""Does partial (bandit) feedback teach the correctness models? A task present only as production rows.

    python benchmarks/bandit_rows.py [--task mbpp] [--folds 5] [--epsilon 0.2] [--skill 0.5]
                                     [--methods task_prior,knn,logreg,probe] [--logreg-c 1.0]

On the bundled RouterBench development rows (5-fold CV by query, near-duplicates together, stratified by
task), the training folds of one task ``--task`` are turned into *production traffic*: each query labels
one candidate, chosen by a simulated logging router with ε-greedy exploration, and its propensity is
logged. The logging router is a good one, which is what makes its rows biased: with probability
``skill`` its greedy choice is the cheapest candidate that the recorded correctness says answers right,
otherwise the static choice (the most accurate candidate on the other tasks); with probability
``epsilon`` it explores uniformly. The logged propensity is the exact probability of the logged choice.

Per method, four training sets (the other tasks' queries complete in every one):

* ``without``: the task's rows left out (today: a query without every candidate labelled is dropped);
* ``unweighted``: plus the task's one-candidate rows, weight 1;
* ``weighted``: plus those rows with the clipped, self-normalised inverse-propensity weights of
  :mod:`litellm_energy_router.training.pairs` (what ``train`` uses);
* ``complete``: plus the task's rows with every candidate labelled (the ceiling: a full tournament).

Judged on the task's held-out queries (complete): AIQ (fold mean ± sd), the accuracy when routing to the
most likely correct candidate (λ = 0), Brier, and the bias of the per-candidate accuracy estimate (mean
over candidates of |mean P_j − accuracy_j|). Ê is the same for all four (fitted on the complete training
rows), so differences come from P only. ``knn`` is tuned by inner CV on each training set; ``logreg``
keeps ``--logreg-c`` (its tuning costs minutes per fit on 2 busy cores); ``probe`` is the router's probe
head with the default C = 0.3. Last lines: paired fold differences, weighted − without and
weighted − unweighted, with their fold sd.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
from litellm_energy_router.training.baselines import make_baseline  # noqa: E402
from litellm_energy_router.training.crossval import baseline_factories, routerbench_matrix  # noqa: E402
from litellm_energy_router.training.data import TableMatrix, kfold, near_duplicate_groups  # noqa: E402
from litellm_energy_router.training.energy_fit import estimate_energy, fit_energy_estimate  # noqa: E402
from litellm_energy_router.training.evaluate import evaluate  # noqa: E402
from litellm_energy_router.training.pairs import SOURCES, ips_weights  # noqa: E402

VARIANTS = ("without", "unweighted", "weighted", "complete")


class ProbePredictor:
    """The router's probe head (per-(task, candidate) logistic regressions on MiniLM embeddings) alone."""

    def __init__(self, C: float = 0.3) -> None:
        self.C = C

    def fit(self, train: TableMatrix) -> "ProbePredictor":
        from litellm_energy_router.training.calibrate import fit_probe
        from litellm_energy_router.training.embed import default_embedder, embed_queries

        self.probe = fit_probe(
            embed_queries(train.texts), train.Y, train.tasks, default_embedder().name, self.C, weights=train.W
        )
        return self

    def predict_proba(self, test: TableMatrix) -> np.ndarray:
        from litellm_energy_router.training.embed import embed_queries

        return 1 / (1 + np.exp(-self.probe.logits(embed_queries(test.texts), list(test.tasks))))


def log_policy(
    Y: np.ndarray, static: int, epsilon: float, skill: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(chosen candidate, its propensity) per row (candidates ordered cheapest first)."""
    n, K = Y.shape
    correct = Y >= 0.5
    oracle = np.where(correct.any(axis=1), correct.argmax(axis=1), K - 1)  # cheapest correct (else the largest)
    pi = np.full((n, K), epsilon / K)
    pi[np.arange(n), oracle] += (1 - epsilon) * skill
    pi[:, static] += (1 - epsilon) * (1 - skill)
    a = (pi.cumsum(axis=1) > rng.uniform(size=(n, 1))).argmax(axis=1)
    return a, pi[np.arange(n), a]


def concat(a: TableMatrix, b: TableMatrix) -> TableMatrix:
    wa = a.W if a.W is not None else np.ones_like(a.Y)
    wb = b.W if b.W is not None else np.ones_like(b.Y)
    return TableMatrix(
        candidates=a.candidates,
        ids=np.concatenate([a.ids, b.ids]),
        tasks=np.concatenate([a.tasks, b.tasks]),
        texts=list(a.texts) + list(b.texts),
        prompt_tokens=np.concatenate([a.prompt_tokens, b.prompt_tokens]),
        Y=np.vstack([a.Y, b.Y]),
        E=np.vstack([a.E, b.E]),
        T=np.vstack([a.T, b.T]),
        W=np.vstack([wa, wb]),
    )


def bandit_part(t: TableMatrix, static: int, args, rng: np.random.Generator) -> dict[str, TableMatrix]:
    """The task's training rows as one-candidate production rows, unweighted and weighted."""
    a, prop = log_policy(t.Y, static, args.epsilon, args.skill, rng)
    rows = np.arange(t.n)
    Y = np.full_like(t.Y, np.nan)
    Y[rows, a] = t.Y[rows, a]
    w, _ = ips_weights(np.full(t.n, SOURCES.index("production")), prop, a, [None] * t.n)
    out = {}
    for name, wv in (("unweighted", np.ones(t.n)), ("weighted", w)):
        W = np.zeros_like(t.Y)
        W[rows, a] = wv
        part = t.subset(rows)
        part.Y, part.W = Y.copy(), W
        out[name] = part
    return out


def run(args) -> None:
    m = routerbench_matrix()
    task = next((t for t in m.task_names() if args.task.lower() in t.lower()), None)
    if task is None:
        sys.exit(f"--task {args.task!r}: no such task (have {m.task_names()})")
    names = args.methods.split(",")
    methods = {**baseline_factories([x for x in names if x not in ("probe", "logreg")])}
    if "logreg" in names:  # C fixed: its inner-CV tuning costs ~80 s a fit on 2 busy cores, x 20 fits
        methods["logreg"] = lambda: make_baseline("logreg", C=args.logreg_c)
    if "probe" in args.methods.split(","):
        methods["probe"] = ProbePredictor
    splits = kfold(near_duplicate_groups(m.texts, m.ids, m.tasks), args.folds, seed=args.seed, groups=m.tasks)
    is_t = m.tasks == task
    t_rows = np.flatnonzero(is_t)
    pos = {int(i): j for j, i in enumerate(t_rows)}
    test = m.subset(t_rows)
    P = {f"{meth}/{v}": np.full((test.n, m.K), np.nan) for meth in methods for v in VARIANTS}
    Eh = np.full((test.n, m.K), np.nan)
    folds, rng, n_logged = [], np.random.default_rng(args.seed), []
    for f, (tr, te) in enumerate(splits):
        other, tt = m.subset(tr[~is_t[tr]]), m.subset(tr[is_t[tr]])
        te_t = np.array([pos[int(i)] for i in te if is_t[i]])
        folds.append(te_t)
        static = int(other.Y.mean(axis=0).argmax())
        parts = bandit_part(tt, static, args, rng)
        n_logged.append(np.bincount(np.nanargmax(np.nan_to_num(parts["weighted"].W), axis=1), minlength=m.K))
        sets = {
            "without": other,
            "unweighted": concat(other, parts["unweighted"]),
            "weighted": concat(other, parts["weighted"]),
            "complete": concat(other, tt),
        }
        Eh[te_t] = estimate_energy(fit_energy_estimate(m.subset(tr)), test.subset(te_t))
        for meth, factory in methods.items():
            for v, train in sets.items():
                t0 = time.perf_counter()
                P[f"{meth}/{v}"][te_t] = factory().fit(train).predict_proba(test.subset(te_t))
                print(
                    f"fold {f + 1}/{args.folds} {meth}/{v}: {time.perf_counter() - t0:.1f}s",
                    file=sys.stderr,
                    flush=True,
                )
    ev = evaluate(test.Y, test.E, {k: (p, Eh) for k, p in P.items()}, m.candidates, folds=folds)
    report(ev, P, test, folds, task, methods, np.sum(n_logged, axis=0), args)


def report(ev, P, test, folds, task, methods, logged, args) -> None:
    acc = test.Y.mean(axis=0)
    print(
        f"task {task}: {test.n} held-out queries over {args.folds} folds; logging ε={args.epsilon}, skill={args.skill}; "
        f"logged rows per candidate {logged.tolist()} (candidates {[c.split('/')[-1] for c in test.candidates]})"
    )
    print(f"true accuracy per candidate on the task {np.round(acc, 3).tolist()}")
    print(
        f"{'method/training rows':26s} {'AIQ fold mean±sd':>18s} {'acc@λ=0 mean±sd':>17s} {'Brier':>7s} {'|P̄−acc|':>9s}"
    )
    rows = {}
    for name, p in P.items():
        res = ev.method(name)
        a0 = [float(test.Y[idx][np.arange(len(idx)), p[idx].argmax(axis=1)].mean()) for idx in folds]
        rows[name] = (np.array(res.aiq_folds), np.array(a0))
        bias = float(np.abs(p.mean(axis=0) - acc).mean())
        print(
            f"{name:26s} {np.mean(res.aiq_folds):9.4f}±{np.std(res.aiq_folds, ddof=1):.4f} "
            f"{np.mean(a0):9.4f}±{np.std(a0, ddof=1):.4f} {res.calibration.brier:7.4f} {bias:9.4f}"
        )
    for meth in methods:
        for other in ("without", "unweighted"):
            da = rows[f"{meth}/weighted"][0] - rows[f"{meth}/{other}"][0]
            dc = rows[f"{meth}/weighted"][1] - rows[f"{meth}/{other}"][1]
            print(
                f"{meth}: weighted - {other}: AIQ {da.mean():+.4f} ± {da.std(ddof=1):.4f} (fold sd), "
                f"acc@λ=0 {dc.mean():+.4f} ± {dc.std(ddof=1):.4f}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="mbpp", help="the task present only as production rows (substring of its name)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epsilon", type=float, default=0.2, help="the logging router's exploration rate")
    ap.add_argument(
        "--skill", type=float, default=0.5, help="share of greedy choices that are the cheapest correct candidate"
    )
    ap.add_argument("--methods", default="task_prior,knn,logreg,probe")
    ap.add_argument(
        "--logreg-c", type=float, default=1.0, help="logreg's C (fixed, not tuned); knn is tuned by inner CV"
    )
    t0 = time.perf_counter()
    run(ap.parse_args())
    print(f"wall {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
