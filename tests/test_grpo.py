"""GRPO stage: the SFT start reproduces the decision rule, buckets sit where decisions switch, and the
never-worse check keeps a bad policy from serving (seconds-long, TrainConfig.quick())."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from router_fixtures import planted_rows

from litellm_energy_router.knob import Knob
from litellm_energy_router.router.checkpoint import read_manifest, write_manifest
from litellm_energy_router.router.decide import decide, lambda_breakpoints
from litellm_energy_router.router.model import RouterModel
from litellm_energy_router.router.policy import POLICY_FILE
from litellm_energy_router.table import open_store


def _planted(n: int = 40, seed: int = 0):
    c, q, runs = planted_rows(n, seed=seed)
    texts, tasks = [x.text for x in q], [x.task for x in q]
    return c, q, runs, texts, tasks


@pytest.fixture(scope="module")
def grpo_ckpt(tmp_path_factory):
    """A quick checkpoint trained with the GRPO stage on the planted rows."""
    from litellm_energy_router.training.grpo import GRPOStageConfig
    from litellm_energy_router.training.pipeline import TrainConfig, train

    d = tmp_path_factory.mktemp("grpo")
    store = open_store(f"sqlite:///{d / 't.db'}")
    c, q, runs, _, _ = _planted()
    store.write(q, runs, candidates=c)
    cfg = TrainConfig.quick()
    cfg.grpo = GRPOStageConfig(steps=4, num_generations=3, prompts_per_step=2, start_epochs=1)
    ck = train(store, d / "ck", cfg, log=lambda s: None)
    store.close()
    return ck


def test_buckets_sit_where_the_calibrated_decision_switches():
    from litellm_energy_router.training.grpo import choice_targets, decision_buckets

    rng = np.random.default_rng(0)
    P = rng.uniform(0.3, 0.95, (200, 4))
    E = np.tile([5.0, 20.0, 60.0, 150.0], (200, 1)) * rng.uniform(0.8, 1.2, (200, 1))
    b = decision_buckets(P, E, 100.0, 8)
    bps = lambda_breakpoints(P, E, 100.0)
    assert b[0] == 0.0 and np.all(np.diff(b) > 0) and len(b) == 8
    assert np.all((b[1:-1] >= bps.min()) & (b[1:-1] <= bps.max()))  # inside the switching range
    C = choice_targets(P, E, b, 100.0)
    # every step between neighbouring buckets changes some decisions; the last bucket is all-cheapest
    assert all((C[i] != C[i + 1]).any() for i in range(len(b) - 1)) and np.all(C[-1] == 0)
    assert np.array_equal(C[2], decide(P, E, Knob(**{"lambda": b[2]}, e_ref_j=100.0)))


def test_sft_start_reproduces_the_decision_rule_on_its_training_queries(planted_ckpt, tmp_path):
    from litellm_energy_router.training.grpo import (
        GRPOStageConfig,
        choice_targets,
        decision_buckets,
        policy_choices,
        train_start,
    )

    r = RouterModel(planted_ckpt, scorer="lm")
    _, _, _, texts, tasks = _planted(40, seed=3)
    P, E = r.score(texts, tasks), r.energy(texts, tasks)
    buckets = decision_buckets(P, E)
    targets = choice_targets(P, E, buckets)
    cfg = GRPOStageConfig(start_epochs=12, start_batch_size=16, start_learning_rate=3e-3)
    start = train_start(r.model, r.tokenizer, r.layout, texts, tasks, targets, cfg, str(tmp_path / "s"))
    got = policy_choices(start, r.layout, texts, tasks, len(buckets))
    chance = np.mean([np.bincount(t, minlength=3).max() / len(t) for t in targets])  # majority label per bucket
    agree = float((got == targets).mean())
    assert agree > chance + 0.1, (agree, chance)
    assert not np.allclose(RouterModel(planted_ckpt, scorer="lm").score(texts, tasks), 0) and r.model.training is False


def test_never_worse_check_serves_only_a_policy_that_beats_the_scorer():
    from litellm_energy_router.training.grpo import never_worse_check

    rng = np.random.default_rng(1)
    n = 400
    Y = (rng.random((n, 3)) < [0.5, 0.7, 0.9]).astype(float)
    E = np.tile([10.0, 30.0, 90.0], (n, 1))
    lams = [0.0, 0.2]
    scorer = np.stack([np.full(n, 2), np.full(n, 2)])  # the most accurate: the best fixed choice at both λ
    oracle = np.stack([np.where(Y[:, 0] == 1, 0, np.where(Y[:, 1] == 1, 1, 2))] * 2)
    bad = np.stack([np.full(n, 0), np.full(n, 0)])  # always the least accurate
    good = never_worse_check(Y, E, lams, oracle, scorer, scorer)
    worse = never_worse_check(Y, E, lams, bad, scorer, scorer)
    assert [c["served"] for c in good] == [True, True] and all(c["vs_scorer"] > 0 for c in good)
    assert [c["served"] for c in worse] == [False, False] and all(c["vs_scorer"] < 0 for c in worse)
    same = never_worse_check(Y, E, lams, scorer, scorer, scorer)  # a tie is not served either
    assert [c["served"] for c in same] == [False, False]


def test_a_bad_policy_is_not_served(grpo_ckpt, tmp_path):
    """A deliberately bad policy (trained to pick the opposite of the decision rule) fails the check on
    held-out planted queries; and even marked served by hand it decides nothing: the checkpoint served
    (and routed, and judged off-policy) decides by the one rule on its scorer's P and Ê."""
    from litellm_energy_router.training.grpo import (
        GRPOStageConfig,
        choice_targets,
        never_worse_check,
        policy_choices,
        train_start,
    )
    from safetensors.torch import save_model

    ck = tmp_path / "ck"
    shutil.copytree(grpo_ckpt, ck)
    r = RouterModel(ck, scorer="lm")
    lams = [b["lambda"] for b in r.manifest.knob["grpo"]["buckets"]]
    _, _, runs, texts, tasks = _planted(40, seed=5)
    P, E = r.score(texts, tasks), r.energy(texts, tasks)
    good = choice_targets(P, E, lams)
    cfg = GRPOStageConfig(start_epochs=12, start_batch_size=16, start_learning_rate=3e-3)
    bad = train_start(r.model, r.tokenizer, r.layout, texts, tasks, 2 - good, cfg, str(tmp_path / "b"))
    _, _, runs_h, texts_h, tasks_h = _planted(40, seed=9)
    Y = np.array([[x["score"] for x in runs_h[i * 3 : i * 3 + 3]] for i in range(40)])
    E_true = np.array([[x["energy_j"] for x in runs_h[i * 3 : i * 3 + 3]] for i in range(40)])
    C_bad = policy_choices(bad, r.layout, texts_h, tasks_h, len(lams))
    C_sc = choice_targets(r.score(texts_h, tasks_h), r.energy(texts_h, tasks_h), lams)
    check = never_worse_check(Y, E_true, lams, C_bad, C_sc, C_sc)
    assert not any(c["served"] for c in check) and min(c["vs_scorer"] for c in check) < 0
    save_model(bad, str(ck / POLICY_FILE))
    m = read_manifest(ck)
    m.knob["grpo"]["buckets"] = check
    write_manifest(ck, m)
    from litellm_energy_router.router.scoring import load_scorer

    knob = Knob(**{"lambda": lams[3]})
    m.knob["grpo"]["buckets"][3]["served"] = True  # forced: the policy would beat the rule at this λ
    write_manifest(ck, m)
    served = load_scorer(ck, "lm")
    assert not hasattr(served, "choose")  # no entry point can run the policy
    got = decide(served.score(texts_h, tasks_h), served.energy(texts_h, tasks_h), knob)
    assert not np.array_equal(got, C_bad[3])


def test_grpo_checkpoint_records_policy_and_check(grpo_ckpt):
    m = read_manifest(grpo_ckpt)
    g = m.knob["grpo"]
    assert g["file"] == POLICY_FILE and POLICY_FILE in m.files and g["beta"] > 0
    lams = [b["lambda"] for b in g["buckets"]]
    assert lams == m.knob["grpo_lambda_buckets"] and lams[0] == 0.0 and np.all(np.diff(lams) > 0)
    for b in g["buckets"]:
        assert {"vs_scorer", "vs_scorer_se", "vs_start", "served"} <= set(b)
        assert not b["served"] or b["vs_scorer"] > 0
    assert not (grpo_ckpt / "_start").exists() and not (grpo_ckpt / "_grpo").exists()
    json.dumps(m.knob)  # the manifest stays plain JSON
