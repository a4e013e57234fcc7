"""Does a bounded retrain lose anything? Budgeted and warm-started LM routers against full-table training,
on the same 5 CV folds (by query, stratified by task) of the bundled development rows.

Each fold's training rows stand for the table a retrain reads; the held-out rows are scored with the
serving scorer (the distilled student) of every checkpoint. Methods:

* ``router`` — the LM router trained on the whole training fold (``energy-router train`` defaults):
  what a retrain with an unbinding budget trains. At the default budget (``retrain.budget.max_queries``
  3,000) a development fold (about 1,770 queries) is never sampled, so the default-budget retrain *is*
  this one; the rows below make the budget bind on purpose.
* ``router@budget`` — trained on a sample of ``--budget`` queries of the fold drawn by the retrain's
  sampler (:func:`~litellm_energy_router.training.sampling.sample_matrix`: stratified by task).
* ``router warm`` — a checkpoint trained from scratch on ``1 - --new-share`` of the fold (the "old"
  table), then a warm-started retrain from it on the rest (the "new" rows) plus ``replay_ratio`` times as
  many old ones (:func:`~litellm_energy_router.training.sampling.warm_sample_matrix`), as ``retrain`` with
  ``warm_start: true`` does. Its cost is the second training only.
* the baselines of model selection (task prior, kNN, logistic regression, MF, stacked), for scale.

Prints the per-method table, the paired per-fold AIQ differences against ``router`` (a difference inside
its fold sd is a tie) and the joules at the best single model's accuracy, and ends with one line
``budget_delta_aiq=... warm_delta_aiq=... warm_cost_ratio=...``.

    python benchmarks/retrain_cv.py                 # 5 folds, about an hour on 2 cores
    python benchmarks/retrain_cv.py --folds 2 --quick --limit 300 --budget 100   # smoke run
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class _Trained:
    """A trained checkpoint as a CV predictor scored by the student; ``seconds``: the retrain's own cost."""

    def __init__(self, quick: bool, costs: list[float], log) -> None:
        self.quick, self.costs, self.log = quick, costs, log

    def _cfg(self, init_from: str | None = None):
        from litellm_energy_router.training.pipeline import TrainConfig

        cfg = TrainConfig.quick() if self.quick else TrainConfig()
        cfg.init_from = init_from
        return cfg

    def _train(self, m, init_from: str | None = None) -> tempfile.TemporaryDirectory:
        from litellm_energy_router.training.pipeline import train_matrix

        d = tempfile.TemporaryDirectory(prefix="er-cv-")
        train_matrix(m, d.name, self._cfg(init_from), log=self.log)
        return d

    def _serve(self, d: tempfile.TemporaryDirectory) -> "_Trained":
        from litellm_energy_router.router.model import RouterModel

        self._dir, self.model = d, RouterModel(d.name, scorer="student")
        return self

    def predict_proba(self, test) -> np.ndarray:
        return self.model.score(list(test.texts), [str(t) for t in test.tasks])

    def predict_energy(self, test) -> np.ndarray:
        return self.model.energy(list(test.texts), [str(t) for t in test.tasks], prompt_tokens=list(test.prompt_tokens))


class Budgeted(_Trained):
    """The LM router trained on ``budget`` queries of the fold, sampled as the retrain samples."""

    def __init__(self, budget: int, quick: bool, costs: list[float], log) -> None:
        super().__init__(quick, costs, log)
        self.budget = budget

    def fit(self, train) -> "Budgeted":
        from litellm_energy_router.training.sampling import TrainingBudget, sample_matrix

        sub, _ = sample_matrix(train, self.budget, TrainingBudget()) if self.budget < len(train) else (train, None)
        t0 = time.perf_counter()
        d = self._train(sub)
        self.costs.append(time.perf_counter() - t0)
        return self._serve(d)


class Warm(_Trained):
    """From scratch on the fold's old share, then a warm-started retrain on its new share plus replay."""

    def __init__(self, new_share: float, quick: bool, costs: list[float], log, seed: int = 0) -> None:
        super().__init__(quick, costs, log)
        self.new_share, self.seed = new_share, seed

    def fit(self, train) -> "Warm":
        from litellm_energy_router.training.sampling import TrainingBudget, warm_sample_matrix

        budget = TrainingBudget()
        new = np.random.default_rng(self.seed).random(len(train)) < self.new_share
        base = self._train(train.take(np.flatnonzero(~new)))
        n = min(len(train), max(int(np.ceil(new.sum() * (1 + budget.replay_ratio))), 50))
        sub, _ = warm_sample_matrix(train, new, n, budget)
        t0 = time.perf_counter()
        d = self._train(sub, init_from=base.name)
        self.costs.append(time.perf_counter() - t0)
        self._base = base
        return self._serve(d)


class Full(Budgeted):
    """The LM router on the whole fold (timed like the others)."""

    def __init__(self, quick: bool, costs: list[float], log) -> None:
        super().__init__(10**9, quick, costs, log)


def _delta(ev, a: str, b: str) -> str:
    d = ev.paired_fold_delta(a, b)
    if d is None:
        return "–"
    mean, sd = d
    return f"{mean:+.4f} ± {sd:.4f} ({'tie' if abs(mean) <= sd else 'beyond the spread'})"


def _jdelta(ev, a: str, b: str) -> str:
    d = np.asarray(ev.method(a).joules_ratio_folds, dtype=float) - np.asarray(
        ev.method(b).joules_ratio_folds, dtype=float
    )
    d = d[np.isfinite(d)]
    if len(d) < 2:
        return "–"
    return f"{d.mean():+.3f} ± {d.std(ddof=1):.3f} ({'tie' if abs(d.mean()) <= d.std(ddof=1) else 'beyond the spread'})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=900, help="training queries of router@budget (about half a fold)")
    ap.add_argument("--new-share", type=float, default=0.3, help="share of each fold that is new to the warm retrain")
    ap.add_argument("--quick", action="store_true", help="quick training (smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None, help="a random subset of this many queries (smoke run)")
    a = ap.parse_args()

    from litellm_energy_router.training.crossval import routerbench_matrix
    from litellm_energy_router.training.report import summary_table
    from litellm_energy_router.training.selection import select, selection_table

    m = routerbench_matrix()
    if a.limit:
        m = m.take(np.sort(np.random.default_rng(a.seed).permutation(m.n)[: a.limit]))
    log = lambda s: None  # noqa: E731
    costs: dict[str, list[float]] = {"router": [], "router@budget": [], "router warm": []}
    extra = {
        "router full": lambda: Full(a.quick, costs["router"], log),
        "router@budget": lambda: Budgeted(a.budget, a.quick, costs["router@budget"], log),
        "router warm": lambda: Warm(a.new_share, a.quick, costs["router warm"], log, a.seed),
    }
    scorers = ["task_prior", "knn", "logreg", "mf", "stacked"]
    t0 = time.time()
    done = lambda i, n, label: print(f"  [{time.time() - t0:6.0f}s] {i + 1}/{n} {label}", flush=True)  # noqa: E731
    print(f"{m.n} development queries x {m.K} candidates; {a.folds} folds; budget {a.budget}; new share {a.new_share}")
    sel = select(m, scorers, folds=a.folds, seed=a.seed, extra=extra, progress=done, per_query_energy=False)
    ev = sel.ev
    print(summary_table(ev))
    print("\nModel selection over the baselines:\n" + selection_table(sel))
    cost = {k: float(np.mean(v)) for k, v in costs.items() if v}
    ratio = lambda n: ev.method(n).joules_at_best / ev.best_energy  # noqa: E731
    print("\ntraining seconds per fold (the retrain's own): " + ", ".join(f"{k} {v:.0f}" for k, v in cost.items()))
    for n in ("router@budget", "router warm"):
        print(
            f"{n} - router full: AIQ {_delta(ev, n, 'router full')}; J at best acc {ratio(n):.3f} vs {ratio('router full'):.3f} "
            f"x best single (per fold {_jdelta(ev, n, 'router full')})"
        )
    print(f"best baseline {sel.best_baseline} - router full: AIQ {_delta(ev, sel.best_baseline, 'router full')}")
    bd, wd = ev.paired_fold_delta("router@budget", "router full"), ev.paired_fold_delta("router warm", "router full")
    print(
        f"budget_delta_aiq={bd[0]:+.4f}±{bd[1]:.4f} warm_delta_aiq={wd[0]:+.4f}±{wd[1]:.4f} "
        f"warm_cost_ratio={cost['router warm'] / cost['router']:.2f} wall_s={time.time() - t0:.0f}"
    )


if __name__ == "__main__":
    main()
