"""Off-policy evaluation: IPS / SNIPS intervals cover the true value of a policy that did not log."""

from __future__ import annotations

import numpy as np
import pytest
from litellm_energy_router.training.ope import estimate_policy, ips, logged_rows, snips, target_probs


def _trial(seed: int, n: int = 2000, k: int = 4, contexts: int = 12):
    rng = np.random.default_rng(seed)
    theta = rng.uniform(0.1, 0.9, size=(contexts, k))  # P(correct | context, action)
    joules = rng.uniform(5, 80, size=(contexts, k))  # mean J of each action
    # logging policy: a noisy softmax with an exploration floor (propensities known, never 0)
    logits = rng.normal(size=(contexts, k)) * 1.5
    pi0 = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    pi0 = 0.9 * pi0 + 0.1 / k
    # the policy under evaluation: deterministic, prefers high theta per joule (differs from the logger)
    new = np.argmax(theta - 0.004 * joules, axis=1)
    ctx_p = rng.dirichlet(np.ones(contexts))
    true_acc = float((ctx_p * theta[np.arange(contexts), new]).sum())
    true_j = float((ctx_p * joules[np.arange(contexts), new]).sum())
    x = rng.choice(contexts, size=n, p=ctx_p)
    a = np.array([rng.choice(k, p=pi0[c]) for c in x])
    r = (rng.random(n) < theta[x, a]).astype(float)
    e = joules[x, a] * rng.lognormal(0, 0.2, size=n) / np.exp(0.02)  # mean-preserving noise
    q = target_probs(new[x], a, k)
    return dict(r=r, e=e, p=pi0[x, a], q=q, true_acc=true_acc, true_j=true_j, x=x, a=a, new=new)


def test_ips_and_snips_95pct_intervals_cover_truth_in_at_least_90_of_100_trials():
    cover = {"ips_acc": 0, "snips_acc": 0, "ips_j": 0, "snips_j": 0}
    logged_acc_err, ips_err = [], []
    for seed in range(100):
        t = _trial(seed)
        est = {
            "ips_acc": ips(t["r"], t["p"], t["q"]),
            "snips_acc": snips(t["r"], t["p"], t["q"]),
            "ips_j": ips(t["e"], t["p"], t["q"]),
            "snips_j": snips(t["e"], t["p"], t["q"]),
        }
        for name, v in est.items():
            cover[name] += v.covers(t["true_acc"] if name.endswith("acc") else t["true_j"])
        logged_acc_err.append(abs(t["r"].mean() - t["true_acc"]))
        ips_err.append(abs(est["ips_acc"].value - t["true_acc"]))
    for name, c in cover.items():
        assert c >= 90, f"{name}: the 95% interval covered the true value in only {c}/100 trials"
    # and the estimate is informative: much closer to the new policy's value than the logged average
    assert np.mean(ips_err) < 0.5 * np.mean(logged_acc_err)


def test_estimate_policy_on_table_like_rows():
    t = _trial(7, n=3000)
    cands = ["small", "mid", "large", "xl"]
    rows = [
        {"source": "production", "status": "success", "candidate": cands[a], "propensity": p, "score": r, "energy_j": e}
        for a, p, r, e in zip(t["a"], t["p"], t["r"], t["e"])
    ]
    rows.append(
        {
            "source": "production",
            "status": "success",
            "candidate": "small",
            "propensity": None,
            "score": 1.0,
            "energy_j": 1.0,
        }
    )
    rows.append(
        {
            "source": "production",
            "status": "failure",
            "candidate": "small",
            "propensity": 0.5,
            "score": None,
            "energy_j": 1.0,
        }
    )
    rows.append(
        {"source": "import", "status": None, "candidate": "small", "propensity": 0.5, "score": 1.0, "energy_j": 1.0}
    )
    usable = logged_rows(rows)
    assert len(usable) == 3000
    chosen = [cands[j] for j in t["new"][t["x"]]]
    pe = estimate_policy(usable, chosen, cands)
    assert pe.n == 3000 and pe.matched == int((t["new"][t["x"]] == t["a"]).sum())
    assert pe.accuracy_snips.covers(t["true_acc"]) and pe.joules_snips.covers(t["true_j"])
    assert pe.accuracy_ips.ess < pe.n  # importance weights cost effective samples
    # the logging policy evaluated on its own log (target probs = propensities): weights 1, the logged mean
    r, p = np.array([x["score"] for x in usable]), np.array([x["propensity"] for x in usable])
    assert ips(r, p, p).value == pytest.approx(pe.logged_accuracy)
    assert snips(r, p, p).value == pytest.approx(pe.logged_accuracy)


def test_a_capped_log_is_a_uniform_sample_whose_estimate_still_covers_the_truth():
    """``logged_rows(cap=)`` keeps memory bounded (reservoir sampling): exactly ``cap`` usable rows, each
    equally likely, and the SNIPS interval on them still covers the new policy's true value."""
    t = _trial(11, n=6000)
    cands = ["small", "mid", "large", "xl"]
    rows = [
        {
            "source": "production",
            "status": "success",
            "candidate": cands[a],
            "propensity": p,
            "score": r,
            "energy_j": e,
            "i": i,
        }
        for i, (a, p, r, e) in enumerate(zip(t["a"], t["p"], t["r"], t["e"]))
    ]
    rows.insert(
        10, {"source": "import", "status": None, "candidate": "small", "propensity": 0.5, "score": 1.0, "energy_j": 1.0}
    )
    assert len(logged_rows(rows, cap=10_000)) == 6000  # under the cap: every usable row
    hits = np.zeros(6000)
    for seed in range(40):
        kept = logged_rows(iter(rows), cap=1500, seed=seed)
        assert len(kept) == 1500 and all(r["source"] == "production" for r in kept)
        hits[[r["i"] for r in kept]] += 1
    # each row kept with probability 1/4: first and second half of the stream alike (no order bias)
    assert abs(hits[:3000].mean() - 10) < 0.5 and abs(hits[3000:].mean() - 10) < 0.5
    kept = logged_rows(rows, cap=1500)
    chosen = [cands[t["new"][t["x"][r["i"]]]] for r in kept]
    pe = estimate_policy(kept, chosen, cands)
    assert pe.n == 1500 and pe.accuracy_snips.covers(t["true_acc"]) and pe.joules_snips.covers(t["true_j"])


def test_zero_or_missing_propensity_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="propensity 0.0 outside"):
        ips([1.0, 0.0], [0.5, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="no logged rows"):
        snips([], [], [])


def test_eval_checkpoint_estimates_it_on_logged_production_rows(tmp_path, planted_ckpt):
    """`eval --checkpoint` adds IPS/SNIPS estimates of the checkpoint on production rows a uniformly random
    router served (propensity 1/3): the planted router would have answered almost all of them."""
    import json
    import random
    import subprocess
    import sys

    from router_fixtures import ENERGY, planted_rows

    from litellm_energy_router.table import make_query, open_store

    url = f"sqlite:///{tmp_path / 't.db'}"
    store = open_store(url)
    cands, queries, runs = planted_rows(30, seed=3)
    store.write(queries, runs, candidates=cands)
    rng = random.Random(0)
    prod_q, prod_r = [], []
    for i in range(300):
        hard = i % 2 == 0
        text = f"Give a proof about glass number {500 + i}" if hard else f"Tell me about glass number {500 + i}"
        q = make_query(f"prod-{i}", "production", text, source="production")
        c = rng.choice(["small", "medium", "large"])
        prod_q.append(q)
        prod_r.append(
            {
                "query_id": q.id,
                "candidate": c,
                "source": "production",
                "status": "success",
                "propensity": 1 / 3,
                "score": 1.0 if (not hard or c == "large") else 0.0,
                "energy_j": ENERGY[c],
                "call_id": f"call-{i}",
                "prompt_tokens": 8,
                "completion_tokens": 20,
            }
        )
    store.write(prod_q, prod_r)
    store.close()
    out = tmp_path / "rep"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "litellm_energy_router.cli",
            "eval",
            "--db",
            url,
            "--out",
            str(out),
            "--no-router",
            "--baselines",
            "none",
            "--folds",
            "2",
            "--checkpoint",
            str(planted_ckpt),
            "--lambda",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert "off-policy estimate of checkpoint" in r.stdout
    est = next(iter(json.loads((out / "off_policy.json").read_text()).values()))
    assert est["n"] == 300 and 0 < est["matched"] < 300
    logged = sum(x["score"] for x in prod_r) / 300
    assert est["logged_accuracy"] == pytest.approx(logged)
    acc = est["accuracy_snips"]
    assert acc["lo"] > logged and acc["value"] > 0.85  # it would have solved far more than the random logger


def test_ips_keeps_rows_logged_on_a_candidate_the_router_lacks(planted_ckpt):
    """Logged uniformly over ``small`` and a candidate the checkpoint lacks (retired from the pool): the router, which
    always picks ``small`` here, uses 10 J a request. Dropping the other rows doubled IPS (20 J, an interval excluding
    the truth); kept at weight 0 they give 10 J."""
    from litellm_energy_router.training.ope import evaluate_checkpoint_on_log

    from litellm_energy_router.knob import Knob
    from litellm_energy_router.router.scoring import load_scorer

    rows = [
        {
            "candidate": "small" if i % 2 else "retired",
            "text": f"Tell me about rivers number {i}",
            "propensity": 0.5,
            "score": float(i % 4 == 1),
            "energy_j": 10.0 if i % 2 else 90.0,
            "prompt_tokens": 5,
        }
        for i in range(400)
    ]
    est = evaluate_checkpoint_on_log(None, load_scorer(planted_ckpt), knob=Knob(lambda_=1000.0), rows=rows)
    assert est.n == 400 and est.joules_ips.value == pytest.approx(10.0) and est.joules_ips.covers(10.0)
    assert est.accuracy_ips.value == pytest.approx(0.5) and est.joules_snips.value == pytest.approx(10.0)


def test_snips_gives_no_interval_on_a_handful_of_effective_rows():
    """One matched row gave a "95 % interval" of zero width ([90, 90]); under MIN_SNIPS_ESS effective rows the value
    comes without bounds (None in the report)."""
    from litellm_energy_router.training.ope import MIN_SNIPS_ESS

    q = np.zeros(1000)
    q[0] = 1.0
    one = snips(np.full(1000, 90.0), np.full(1000, 0.5), q)
    assert one.value == 90.0 and np.isnan(one.lo) and np.isnan(one.hi) and one.as_dict()["lo"] is None
    assert "no interval" in str(one)
    many = snips(np.arange(100.0), np.full(100, 0.5), np.ones(100))
    assert many.ess >= MIN_SNIPS_ESS and many.lo < many.value < many.hi
