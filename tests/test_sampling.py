"""The retrain sampler: every stratum represented, weighted estimates unbiased (Horvitz–Thompson)."""

from __future__ import annotations

import numpy as np
from litellm_energy_router.training.sampling import TrainingBudget, sample_matrix, sample_rows, uncertainty_from_proba


def _table(seed: int = 0):
    """Synthetic (task, candidate, source) rows whose correctness depends on recency and router
    uncertainty, the two things the sampler favours; one task is tiny. Propensity weights on
    production rows."""
    rng = np.random.default_rng(seed)
    sizes = {"arc": 9000, "mbpp": 4000, "wino": 6000, "rare": 12}
    task = np.concatenate([[t] * n for t, n in sizes.items()])
    n = len(task)
    cand = rng.choice(["small", "mid", "large"], n)
    source = rng.choice(["import", "production"], n, p=[0.7, 0.3])
    recency = rng.permutation(n).astype(float)
    P = rng.random((n, 3))
    u = uncertainty_from_proba(P)
    base = np.where(source == "production", 1.0 / rng.uniform(0.05, 1.0, n), 1.0)
    p_true = 0.2 + 0.4 * (recency / n) + 0.3 * u
    y = (rng.random(n) < p_true).astype(float)
    strata = [f"{a}|{b}|{c}" for a, b, c in zip(task, cand, source)]
    return strata, task, cand, recency, u, base, y


def test_sampler_keeps_every_task_and_candidate():
    strata, task, cand, recency, u, base, y = _table()
    cfg = TrainingBudget(min_per_stratum=5)
    s = sample_rows(strata, 1000, recency=recency, uncertainty=u, base_weight=base, cfg=cfg)
    assert len(s.idx) < len(y) / 5  # the budget bounds the sample
    assert set(strata) == {strata[i] for i in s.idx}  # every (task, candidate, source) stratum
    assert set(task) == set(task[s.idx]) and set(cand) == set(cand[s.idx])
    keys, counts = np.unique(strata, return_counts=True)
    small = set(keys[counts <= cfg.min_per_stratum])  # strata no larger than the floor are kept whole
    assert small and {i for i, k in enumerate(strata) if k in small} <= set(s.idx.tolist())
    # recent and uncertain rows are favoured
    assert recency[s.idx].mean() > recency.mean() and u[s.idx].mean() > u.mean()


def test_weighted_estimate_is_unbiased_on_known_truth():
    strata, task, cand, recency, u, base, y = _table(1)
    truth = float(np.sum(base * y))  # the propensity-weighted total over the whole table
    ests, naive, inside = [], [], 0
    reps = 200
    for seed in range(reps):
        s = sample_rows(strata, 1500, recency=recency, uncertainty=u, base_weight=base, cfg=TrainingBudget(seed=seed))
        est = s.horvitz_thompson(y[s.idx])
        # the Poisson-sampling variance of this one estimate (conservative for a fixed-size design): its error bar
        var = float(np.sum((1 - s.pi) / s.pi**2 * (base[s.idx] * y[s.idx]) ** 2))
        inside += abs(est - truth) <= 3 * np.sqrt(var)
        ests.append(est)
        naive.append(float(np.sum(base[s.idx] * y[s.idx])) * len(y) / len(s.idx))
    ests, naive = np.array(ests), np.array(naive)
    se = ests.std(ddof=1) / np.sqrt(reps)
    assert abs(ests.mean() - truth) <= 4 * se, (ests.mean(), truth, se)
    assert abs(naive.mean() - truth) > 4 * naive.std(ddof=1) / np.sqrt(reps)  # without weights: biased
    assert inside >= 0.95 * reps  # the per-sample 3-sigma bars cover the truth


def test_small_table_is_kept_whole_with_its_weights():
    strata = ["a"] * 30 + ["b"] * 20
    base = np.linspace(1, 3, 50)
    s = sample_rows(strata, 100, base_weight=base)
    assert s.idx.tolist() == list(range(50)) and np.allclose(s.weight, base)


def test_sample_matrix_stratifies_by_task_and_carries_weights():
    from litellm_energy_router.training.data import TableMatrix

    rng = np.random.default_rng(2)
    n, K = 3000, 4
    tasks = np.array(["a"] * 2500 + ["b"] * 490 + ["c"] * 10, dtype=object)
    m = TableMatrix(
        candidates=[f"m{k}" for k in range(K)],
        ids=np.array([f"q{i}" for i in range(n)], dtype=object),
        tasks=tasks,
        texts=[f"text {i}" for i in range(n)],
        prompt_tokens=np.full(n, 10.0),
        Y=(rng.random((n, K)) < 0.5).astype(float),
        E=np.ones((n, K)),
        T=np.ones((n, K)),
        last_run=np.arange(n),
    )
    sm, s = sample_matrix(m, 300, TrainingBudget(min_per_stratum=10))
    assert set(sm.tasks) == {"a", "b", "c"} and (sm.tasks == "c").sum() == 10
    assert sm.weight is not None and len(sm.weight) == len(sm) and np.all(sm.weight >= 1)
    truth = m.Y.sum(axis=0)
    est = (sm.Y * sm.weight[:, None]).sum(axis=0)
    var = ((1 - s.pi) / s.pi**2)[:, None] * sm.Y**2
    assert np.all(np.abs(est - truth) <= 4 * np.sqrt(var.sum(axis=0)))


def test_embedding_cache_survives_retrains_and_merges_shards(tmp_path):
    """A query embedded by one retrain is read from disk by the next; many shards are merged into one."""
    from litellm_energy_router.training.embed import CachedEmbedder

    class Counting:
        name = "counting"

        def __init__(self):
            self.seen: list[str] = []

        def embed(self, texts):
            self.seen.extend(texts)
            return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)

    CachedEmbedder.max_shards = 3
    try:
        first = Counting()
        c = CachedEmbedder(first, tmp_path)
        for i in range(6):  # one shard per call that computed something, merged past 3
            c.embed([f"q{i}", "shared"])
        assert len(list((tmp_path / "counting").glob("*.npz"))) <= 3
        later = Counting()  # a later retrain: a fresh process, same cache directory
        out = CachedEmbedder(later, tmp_path).embed([f"q{i}" for i in range(6)] + ["shared", "new one"])
        assert later.seen == ["new one"] and out[:, 0].tolist() == [2] * 6 + [6, 7]
    finally:
        CachedEmbedder.max_shards = 32


def test_bound_pairs_keeps_trained_complete_queries_and_samples_partial_ones_unbiased(tmp_path):
    """A bounded retrain's pairs: the complete queries it trains on, and a uniform sample of the queries only
    production rows label with weights / π, so the weighted sum of production labels stays unbiased."""
    from litellm_energy_router.training.pairs import load_pairs
    from litellm_energy_router.training.sampling import bound_pairs

    from litellm_energy_router.table import make_query, open_store

    st = open_store(f"sqlite:///{tmp_path / 't.db'}")
    qs = [make_query(f"c{i}", "t", f"complete {i}", source="tournament") for i in range(6)]
    qs += [make_query(f"p{i}", "t", f"production {i}", source="production") for i in range(400)]
    runs = [
        {"query_id": f"c{i}", "candidate": c, "source": "tournament", "score": 1.0, "energy_j": 5.0}
        for i in range(6)
        for c in ("a", "b")
    ]
    runs += [
        {
            "query_id": f"p{i}",
            "candidate": "a",
            "source": "production",
            "score": float(i % 4 == 0),
            "energy_j": 5.0,
            "propensity": 0.5,
        }
        for i in range(400)
    ]
    st.write(qs, runs, candidates=[{"name": "a"}, {"name": "b"}])
    pairs = load_pairs(st)
    st.close()
    full, info = bound_pairs(pairs, ["c0", "c1", "c2"], None)
    assert sorted(i for i in full.ids.tolist() if i.startswith("c")) == ["c0", "c1", "c2"]  # c3..c5: not trained on
    assert info == {"partial_queries": 400, "partial_sampled": 400} and full.n == 6 + 400
    isp = np.char.startswith(full.ids[full.q].astype(str), "p")
    truth = float(np.sum(full.weight[isp] * full.y[isp]))
    sums = []
    for seed in range(200):
        b, inf = bound_pairs(pairs, ["c0", "c1", "c2"], 50, seed)
        assert inf["partial_sampled"] == 50 and len(b.ids) == 3 + 50
        isp = np.char.startswith(b.ids[b.q].astype(str), "p")
        sums.append(float(np.sum(b.weight[isp] * b.y[isp])))
    se = np.std(sums, ddof=1) / np.sqrt(len(sums))
    assert abs(np.mean(sums) - truth) < 4 * se + 1e-9  # unbiased: the mean over samples hits the full sum
    # the energy runs of the sampled production queries carry the same 1/π (the J/token fits read them)
    rw = b.runs["w"][np.char.startswith(b.run_ids[b.runs["q"].astype(np.int64)].astype(str), "p")]
    assert len(rw) == 50 and np.allclose(rw, 400 / 50)


def test_scale_weights_multiplies_the_pairs_and_runs_of_the_named_queries_only():
    """A sampled retrain's complete queries carry 1/π into their pairs (probe head) and runs (energy fit)."""
    from litellm_energy_router.training.pairs import PairReader

    reader = PairReader(None)
    for i, (qid, cand) in enumerate([("x", "a"), ("x", "b"), ("y", "a"), ("y", "b")]):
        reader.add(
            {
                "id": i + 1,
                "query_id": qid,
                "candidate": cand,
                "task": "t",
                "text": qid,
                "source": "tournament",
                "score": 1.0,
                "energy_j": 2.0,
                "prompt_tokens": 5,
                "completion_tokens": 7,
            }
        )
    p = reader.table(["a", "b"])
    p.scale_weights(["x"], [2.5])
    by_q = p.ids[p.q].astype(str)
    assert np.allclose(p.weight[by_q == "x"], 2.5) and np.allclose(p.weight[by_q == "y"], 1.0)
    run_q = p.run_ids[p.runs["q"].astype(np.int64)].astype(str)
    assert np.allclose(p.runs["w"][run_q == "x"], 2.5) and np.allclose(p.runs["w"][run_q == "y"], 1.0)
