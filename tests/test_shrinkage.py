"""A new task's few rows shrink toward the pooled rate with pseudo-rows chosen by leave-task-out CV, and
IPS-weighted production rows count as the rows they are, not as their weight sum."""

from __future__ import annotations

import numpy as np
import pytest
from litellm_energy_router.training.baselines import make_baseline, pseudo_rows_cv, task_prior
from litellm_energy_router.training.data import TableMatrix


def _tasks(rates: np.ndarray, n: int = 200, seed: int = 0) -> TableMatrix:
    """``rates[T, K]``: each task's correctness rate per candidate, ``n`` Bernoulli rows per task."""
    rng = np.random.default_rng(seed)
    T, K = rates.shape
    tasks = np.repeat([f"t{i}" for i in range(T)], n).astype(object)
    Y = (rng.random((T * n, K)) < np.repeat(rates, n, axis=0)).astype(float)
    return TableMatrix(
        candidates=[f"c{k}" for k in range(K)],
        ids=np.array([f"q{i}" for i in range(T * n)], dtype=object),
        tasks=tasks,
        texts=["q"] * (T * n),
        prompt_tokens=np.full(T * n, 10.0),
        Y=Y,
        E=np.ones((T * n, K)),
        T=np.ones((T * n, K)),
    )


def test_pseudo_rows_follow_the_spread_between_tasks():
    rng = np.random.default_rng(1)
    alike = _tasks(np.full((8, 3), 0.6))  # every task the same: the pooled rate is the best guess
    apart = _tasks(rng.choice([0.1, 0.9], size=(8, 3)))  # tasks far apart: a task's own rows are
    a_alike, mse_alike = pseudo_rows_cv(alike)
    a_apart, mse_apart = pseudo_rows_cv(apart)
    assert a_alike >= 20 and a_apart <= 1.0, (a_alike, a_apart)
    assert mse_alike[a_alike] <= min(mse_alike.values()) and set(mse_apart) == set(mse_alike)
    assert pseudo_rows_cv(alike.subset(np.flatnonzero(alike.tasks == "t0"))) == (1.0, {})  # one task: no CV


def test_task_prior_is_fitted_with_its_cv_alpha_and_explored_rows_count_once():
    rng = np.random.default_rng(2)
    table = _tasks(np.clip(0.6 + rng.normal(0, 0.1, (6, 2)), 0, 1))
    tp = make_baseline("task_prior").fit(table)
    assert tp.params["alpha"] == pseudo_rows_cv(table)[0] > 1.0
    # a new task's production rows: c0 served 20 times (all right, weight ~1), c1 explored once (wrong, IPS weight 40)
    n = 21
    prod = TableMatrix(
        candidates=table.candidates,
        ids=np.array([f"p{i}" for i in range(n)], dtype=object),
        tasks=np.array(["new"] * n, dtype=object),
        texts=["p"] * n,
        prompt_tokens=np.full(n, 10.0),
        Y=np.array([[1.0, np.nan]] * 20 + [[np.nan, 0.0]]),
        E=np.ones((n, 2)),
        T=np.ones((n, 2)),
        W=np.array([[1.05, np.nan]] * 20 + [[np.nan, 40.0]]),
    )
    both = TableMatrix(
        candidates=table.candidates,
        ids=np.concatenate([table.ids, prod.ids]),
        tasks=np.concatenate([table.tasks, prod.tasks]),
        texts=table.texts + prod.texts,
        prompt_tokens=np.concatenate([table.prompt_tokens, prod.prompt_tokens]),
        Y=np.vstack([table.Y, prod.Y]),
        E=np.ones((table.n + n, 2)),
        T=np.ones((table.n + n, 2)),
        W=np.vstack([np.ones_like(table.Y), prod.W]),
    )
    alpha = tp.params["alpha"]
    p = task_prior(both, ["new"], alpha)[0]
    glob = task_prior(both, ["unseen"], alpha)[0]
    assert p[1] == pytest.approx(alpha * glob[1] / (1.0 + alpha))  # one row's worth, not 40
    assert p[1] > 0.5 * glob[1] and glob[0] < p[0] < 1.0
    assert (
        task_prior(both, ["new"], alpha)[0][0]
        == make_baseline("task_prior", alpha=alpha).fit(both).predict_proba(prod)[0][0]
    )
