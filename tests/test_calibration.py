"""Calibration head: prior (task, length) on all training queries + the LM's slot logit on top."""

from __future__ import annotations

import numpy as np

from litellm_energy_router.router.model import scores_from_logits
from litellm_energy_router.training.calibrate import fit_calibration


def _problem(n=600, seed=0):
    rng = np.random.default_rng(seed)
    tasks = np.array(["a", "b"])[rng.integers(0, 2, n)]
    lens = rng.integers(20, 2000, n)
    texts = ["x" * int(k) for k in lens]
    hard = np.log1p(lens) > np.log1p(lens).mean()  # long queries are hard for candidate 0
    signal = rng.normal(size=n)  # what the LM sees: candidate 1 succeeds when it is high
    Y = np.stack([(~hard & (rng.random(n) < 0.9)) | (rng.random(n) < 0.1), signal + 0.3 * rng.normal(size=n) > 0], axis=1).astype(float)
    Y[tasks == "b", 1] = (rng.random((tasks == "b").sum()) < 0.8).astype(float)  # no signal on task b
    z = np.stack([rng.normal(size=n), 2.0 * signal], axis=1)
    return tasks, texts, Y, z


def test_prior_uses_length_and_lm_slope_follows_the_signal():
    tasks, texts, Y, z = _problem()
    cal = np.arange(150)
    c = fit_calibration(z[cal], z[cal], Y[cal], tasks[cal], texts=[texts[i] for i in cal], Y_all=Y, tasks_all=tasks,
                        texts_all=texts, use_length=True)  # fmt: skip
    assert c["prior"]["a"]["c"][0] < -1.0 and abs(c["a"][0]) < 0.5 and c["a"][1] > 0.5
    P = scores_from_logits(z, c, list(tasks), texts)
    assert P.shape == Y.shape and np.all((P > 0) & (P < 1))
    brier = ((P - Y) ** 2).mean(axis=0)
    base = ((Y.mean(axis=0) - Y) ** 2).mean(axis=0)
    assert brier[0] < 0.7 * base[0] and brier[1] < 0.7 * base[1]
    # unknown task: pooled prior and the task-hidden slope; never fails, still informative
    Pu = scores_from_logits(z, c, [None] * len(z), texts)
    assert ((Pu - Y) ** 2).mean() < ((Y.mean(axis=0) - Y) ** 2).mean()
    # without the length feature the prior is the per-task rate
    c2 = fit_calibration(z[cal], z[cal], Y[cal], tasks[cal], texts=[texts[i] for i in cal], Y_all=Y, tasks_all=tasks,
                         texts_all=texts)  # fmt: skip
    assert c2["prior"]["a"]["c"] == [0.0, 0.0]


def test_old_calibration_form_still_scores():
    old = {"a": [1.0, 2.0], "b_task": {"t": [0.0, 1.0]}, "a_any": [1.0, 1.0], "b_any": [0.0, 0.0]}
    P = scores_from_logits(np.zeros((2, 2)), old, ["t", None])
    assert np.allclose(P, [[0.5, 1 / (1 + np.exp(-1.0))], [0.5, 0.5]])
