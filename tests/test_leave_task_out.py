"""``eval --leave-task-out``: each task is judged by methods trained on the other tasks only, with its
task hidden, so a method cannot use a prior of the held-out task."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from router_fixtures import planted_rows

from litellm_energy_router.table import open_store


def _two_task_table(url):
    c, q, runs = planted_rows(40, seed=2)
    q = [qq.model_copy(update={"task": "alpha" if i < 20 else "beta"}) for i, qq in enumerate(q)]
    store = open_store(url)
    store.write(q, runs, candidates=c)
    return store


def test_held_out_task_gets_no_prior_of_its_own(tmp_path):
    from litellm_energy_router.training.crossval import baseline_factories, leave_task_out
    from litellm_energy_router.training.data import load_matrix

    store = _two_task_table(f"sqlite:///{tmp_path / 't.db'}")
    m = load_matrix(store)
    seen = {}

    class Spy:
        def __init__(self):
            self.inner = baseline_factories(["task_prior"])["task_prior"]()

        def fit(self, train):
            seen.setdefault("train_tasks", []).append(sorted(set(train.tasks.tolist())))
            self.inner.fit(train)
            self.glob = train.Y.mean(axis=0)
            return self

        def predict_proba(self, test):
            seen.setdefault("test_tasks", []).append(sorted(set(test.tasks.tolist())))
            P = self.inner.predict_proba(test)
            np.testing.assert_allclose(P, np.tile(self.glob, (test.n, 1)))  # the pooled prior: the task is unseen
            return P

    evs = leave_task_out({"spy": Spy}, m)
    assert set(evs) == {"alpha", "beta"} and all(ev.n == 20 for ev in evs.values())
    assert seen["train_tasks"] == [["beta"], ["alpha"]] and seen["test_tasks"] == [["unknown"], ["unknown"]]
    assert all(len(ev.method("spy").aiq_folds) == 5 for ev in evs.values())


def test_eval_cli_leave_task_out_prints_the_per_task_table(tmp_path):
    _two_task_table(f"sqlite:///{tmp_path / 't.db'}").close()
    exe = str(Path(sys.executable).with_name("energy-router"))
    r = subprocess.run(
        [
            exe,
            "eval",
            "--db",
            f"sqlite:///{tmp_path / 't.db'}",
            "--out",
            str(tmp_path / "o"),
            "--no-router",
            "--baselines",
            "task_prior",
            "--leave-task-out",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ},
    )
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "o" / "leave_task_out.md").read_text()
    assert "## held-out task: alpha (20 queries)" in text and "## held-out task: beta (20 queries)" in text
    assert "| task_prior |" in text and "| zero router (static hull) |" in text
