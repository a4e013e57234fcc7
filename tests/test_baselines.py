"""Learned baselines and cross-validation: a planted signal that embedding-based baselines must find and
the task prior cannot, tuning that never sees test queries, the embedding cache and the registry."""

from __future__ import annotations

import numpy as np
import pytest
from litellm_energy_router.training.baselines import KNN, baseline_names, brier, make_baseline, task_prior
from litellm_energy_router.training.crossval import baseline_factories, cross_validate
from litellm_energy_router.training.data import TableMatrix, load_matrix
from litellm_energy_router.training.embed import CachedEmbedder, MiniLMEmbedder, query_block

from litellm_energy_router.energy.profile import EnergyProfile, ModelEnergy
from litellm_energy_router.table import Candidate, Run, make_query, open_store

PROFILE = EnergyProfile(
    models={
        "small": ModelEnergy(j_per_output_token=0.1, j_per_prompt_token=0.001),
        "large": ModelEnergy(j_per_output_token=1.0, j_per_prompt_token=0.01),
    }
)
# One few-shot prefix shared by every row, longer than MiniLM's 256-token window: only embedding the
# query block (after the last blank line) can see the planted signal.
PREFIX = " ".join(f"Example {i}: the answer to question {i} is option {'AB'[i % 2]}." for i in range(40)) + "\n\n"
FOODS = ["lentil soup", "banana bread", "fried rice", "tomato salad", "pancakes", "risotto", "chili", "omelette"]
WHO = ["my grandmother", "a picky child", "two guests", "a camping trip", "a rainy evening"]


def _planted_rows(n: int = 120, seed: int = 0):
    """Half the queries ask for a proof (only the large model solves them), half ask for a recipe (both
    solve them). All share one task, so the task prior sees 50 % / 100 % and cannot route per query."""
    rng = np.random.default_rng(seed)
    qs, runs = [], []
    for i in range(n):
        proof = i % 2 == 0
        if proof:
            a, b = rng.integers(2, 99, size=2)
            text = (
                PREFIX
                + f"Prove that for every integer n the expression {a}n^2 + {b}n is divisible by {int(rng.integers(2, 9))}; give a rigorous proof."
            )
        else:
            text = (
                PREFIX
                + f"Suggest a simple recipe for {FOODS[int(rng.integers(len(FOODS)))]} to cook for {WHO[int(rng.integers(len(WHO)))]}."
            )
        qs.append(make_query(f"q{i}", "mixed", text))
        for c, ok in (("small", not proof), ("large", True)):
            pt, ct = 300, 20
            e = PROFILE.estimate_j(c, pt, ct)
            runs.append(
                Run(
                    query_id=f"q{i}",
                    candidate=c,
                    source="tournament",
                    score=float(ok),
                    prompt_tokens=pt,
                    completion_tokens=ct,
                    energy_j=e,
                )
            )
    return qs, runs


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return CachedEmbedder(MiniLMEmbedder(), tmp_path_factory.mktemp("emb"))


@pytest.fixture
def planted(sqlite_url) -> TableMatrix:
    qs, runs = _planted_rows()
    store = open_store(sqlite_url)
    store.write(qs, runs, candidates=[Candidate(name="small"), Candidate(name="large")])
    m = load_matrix(store)
    store.close()
    return m


def test_query_block():
    assert query_block("few\n\nshot\n\n  the question?\nA) x\n") == "the question?\nA) x"
    assert query_block("no blank line") == "no blank line"
    assert query_block("a\n \t\nb") == "b"
    assert query_block(None) == "" and query_block("") == ""


def test_embedding_cache_reuses_and_persists(tmp_path):
    class CountingEmbedder:  # a stand-in encoder so the cache logic is tested without model time
        name = "counting/v1"

        def __init__(self):
            self.seen: list[str] = []

        def embed(self, texts):
            self.seen.extend(texts)
            return np.array([[len(t), t.count("a")] for t in texts], dtype=np.float32)

    inner = CountingEmbedder()
    c = CachedEmbedder(inner, tmp_path)
    v1 = c.embed(["aa", "b", "aa"])
    assert sorted(inner.seen) == ["aa", "b"] and v1.tolist() == [[2, 2], [1, 0], [2, 2]]
    c.embed(["b"])
    assert sorted(inner.seen) == ["aa", "b"]
    inner2 = CountingEmbedder()
    assert CachedEmbedder(inner2, tmp_path).embed(["b", "aa", "ccc"]).tolist() == [[1, 0], [2, 2], [3, 0]]
    assert inner2.seen == ["ccc"]  # the others came from disk
    assert list((tmp_path / "counting_v1").glob("*.npz"))


def test_minilm_embeds_the_query_block_unit_norm(embedder):
    v = embedder.embed([query_block(PREFIX + "Prove that 2 is prime."), "Suggest a recipe for soup."])
    assert v.shape == (2, 384) and np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_planted_signal_embedding_baselines_beat_task_prior(planted, embedder):
    methods = baseline_factories(["task_prior", "knn", "logreg"], embedder=embedder)
    methods["mf"] = lambda: make_baseline("mf", embedder=embedder, dim=16, l2=1e-3)
    ev = cross_validate(methods, planted, folds=3, profile=PROFILE, n_points=15)
    prior = ev.method("task_prior")
    # the task prior can only mix the static points; the learned ones route proofs to "large"
    assert prior.aiq <= ev.method("zero router (static hull)").aiq + 1e-9
    for name in ("knn", "logreg", "mf"):
        m = ev.method(name)
        assert m.aiq > prior.aiq + 0.1, (name, m.aiq, prior.aiq)
        assert m.curve.accuracy.max() >= 0.95
        assert m.joules_at_best < 0.8 * prior.joules_at_best  # best single = "large", accuracy 1.0
    assert any("knn" in n and "hyperparameters per fold" in n for n in ev.notes)
    assert all(ev.method("oracle").aiq >= ev.method(n).aiq - 1e-9 for n in methods)  # the oracle frontier bounds all


def test_tuning_and_fitting_never_see_test_queries(planted, embedder):
    seen: dict[str, list[set[str]]] = {"fit": [], "inner": [], "predict": []}

    class SpyKNN(KNN):
        def fit(self, train):
            seen["fit"].append(set(train.ids))
            return super().fit(train)

        def _fit(self, train, X, **params):
            seen["inner"].append(set(train.ids))
            super()._fit(train, X, **params)

        def predict_proba(self, test):
            seen["predict"].append(set(test.ids))
            return super().predict_proba(test)

    ev = cross_validate({"spy": lambda: SpyKNN(embedder=embedder, k=10)}, planted, folds=3, profile=PROFILE, n_points=5)
    assert len(seen["fit"]) == len(seen["predict"]) == 3
    assert set().union(*seen["predict"]) == set(planted.ids)
    for fit_ids, test_ids in zip(seen["fit"], seen["predict"]):
        assert fit_ids.isdisjoint(test_ids)
    # every inner fit (tuning over "shrink", then the refit) used only that fold's training queries
    assert len(seen["inner"]) == 3 * (4 * 3 + 1)
    outer = [f for f in seen["fit"] for _ in range(13)]
    assert all(inner <= fit for inner, fit in zip(seen["inner"], outer))
    assert ev.method("spy").aiq > 0


def test_predictor_interface_and_energy_hook(planted):
    class Constant:
        """A minimal external predictor (what the LM router plugs in): constant P, own Ê."""

        def fit(self, train):
            self.p = train.Y.mean(axis=0)
            return self

        def predict_proba(self, test):
            return np.tile(self.p, (test.n, 1))

        def predict_energy(self, test):
            return np.tile([1.0, 2.0], (test.n, 1))

    ev = cross_validate(Constant, planted, folds=3, profile=PROFILE, n_points=5)
    r = ev.method("router")
    assert r.curve.shares[0].tolist() == [0.0, 1.0] and r.curve.shares[-1].tolist() == [1.0, 0.0]

    class BadShape(Constant):
        def predict_proba(self, test):
            return np.zeros((test.n, 3))

    with pytest.raises(ValueError, match="shape"):
        cross_validate({"bad": BadShape}, planted, folds=3, profile=PROFILE)


def test_registry_and_task_prior(planted):
    assert set(baseline_names()) >= {"task_prior", "knn", "logreg", "mf"}
    with pytest.raises(ValueError, match="unknown"):
        make_baseline("nope")
    with pytest.raises(ValueError, match="hyperparameter 'depth'"):
        make_baseline("knn", depth=3)
    P = task_prior(planted, ["mixed", "unseen"], alpha=0.0)
    assert P[0].tolist() == pytest.approx(planted.Y.mean(axis=0).tolist())
    tp = make_baseline("task_prior").fit(planted).predict_proba(planted)
    assert tp.shape == (planted.n, 2) and brier(tp, planted.Y) == pytest.approx(0.125, abs=0.01)
