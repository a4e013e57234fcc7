"""Training from partial (bandit) feedback: every labelled (query, candidate) run counts, production rows
inverse-propensity weighted, the energy estimate prefers measured production joules."""

from __future__ import annotations

import numpy as np
import pytest
from router_fixtures import CANDS, TOPICS, planted_rows

from litellm_energy_router.table import make_query, open_store


def _store(tmp_path, name="t.db"):
    return open_store(f"sqlite:///{tmp_path / name}")


def _prod(qid, cand, score, energy=10.0, prop=0.5, **kw):
    return {
        "query_id": qid,
        "candidate": cand,
        "source": "production",
        "score": score,
        "energy_j": energy,
        "prompt_tokens": 8,
        "completion_tokens": 20,
        "propensity": prop,
        **kw,
    }


def test_unbiased_row_wins_over_production_and_weights_normalise(any_url):
    from litellm_energy_router.training.pairs import SOURCES, load_pairs

    st = open_store(any_url)
    qs = [make_query(f"q{i}", "t", f"text {i}", source="tournament") for i in range(4)]
    runs = [
        {"query_id": "q0", "candidate": c, "source": "tournament", "score": 1.0, "energy_j": 5.0} for c in ("a", "b")
    ]
    runs += [
        _prod("q0", "a", 0.0, prop=0.5),  # same pair as a tournament run: the tournament run labels it
        _prod("q1", "a", 1.0, prop=0.5),
        _prod("q2", "a", 0.0, prop=0.25),
        _prod("q3", "b", 1.0, prop=1e-6),
        {**_prod("q3", "a", None), "score": None},
    ]  # unlabelled: energy only
    st.write(qs, runs, candidates=[{"name": "a"}, {"name": "b"}])
    p = load_pairs(st)
    st.close()
    assert p.n == 5 and sorted(p.ids.tolist()) == ["q0", "q1", "q2", "q3"]
    i0 = int(np.flatnonzero(p.ids == "q0")[0])
    a = p.candidates.index("a")
    row = np.flatnonzero((p.q == i0) & (p.c == a))
    assert (
        len(row) == 1 and SOURCES[p.source[row[0]]] == "tournament" and p.y[row[0]] == 1.0 and p.weight[row[0]] == 1.0
    )
    prod_a = (p.c == a) & (p.source == SOURCES.index("production"))
    w = p.weight[prod_a]
    assert w.sum() == pytest.approx(prod_a.sum())  # self-normalised per (router version, candidate)
    assert w[np.argsort(p.propensity[prod_a])][0] == pytest.approx(2 * w[np.argsort(p.propensity[prod_a])][1])  # ∝ 1/p
    assert p.stats["production_clipped"] == 1  # propensity 1e-6 clipped at the maximum weight
    assert len(p.runs["e"]) == 7  # every run with joules (labelled or not) feeds the energy estimate
    m = p.matrix()
    assert m.W.shape == m.Y.shape and np.isnan(m.Y).sum() == 3 and (m.W[np.isnan(m.Y)] == 0).all()


def test_weights_normalise_per_logging_router_version():
    from litellm_energy_router.training.pairs import SOURCES, PairWeighting, ips_weights

    prod, tour = SOURCES.index("production"), SOURCES.index("tournament")
    src = np.array([prod, prod, prod, prod, tour])
    prop = np.array([0.5, 0.1, 0.2, 0.2, np.nan])
    w, stats = ips_weights(src, prop, np.zeros(5, dtype=int), np.array(["v1", "v1", "v2", None, None], dtype=object))
    assert w.tolist() == pytest.approx(
        [2 / 12 * 2, 10 / 12 * 2, 1.0, 1.0, 1.0]
    )  # each version's rows sum to their count
    raw, _ = ips_weights(
        src, prop, np.zeros(5, dtype=int), [None] * 5, PairWeighting(max_weight=8.0, self_normalise=False)
    )
    assert raw.tolist() == pytest.approx([2.0, 8.0, 5.0, 5.0, 1.0])  # 1/p, clipped at 8
    assert stats["production_no_propensity"] == 0


def _skewed_table(tmp_path, n: int, seed: int):
    """Known truth: candidate ``a`` is right with probability x, ``b`` with 1 - x; the logging router
    picks ``a`` with probability 0.15 + 0.7 x (it knows x), so its choices correlate with correctness."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=n)
    Y = np.stack([rng.uniform(size=n) < x, rng.uniform(size=n) < 1 - x], axis=1).astype(float)
    pa = 0.15 + 0.7 * x
    pick_a = rng.uniform(size=n) < pa
    qs = [make_query(f"q{i}", "t", f"query {i}", source="production") for i in range(n)]
    runs = [
        _prod(
            f"q{i}",
            "a" if pick_a[i] else "b",
            Y[i, 0 if pick_a[i] else 1],
            prop=float(pa[i] if pick_a[i] else 1 - pa[i]),
        )
        for i in range(n)
    ]
    st = _store(tmp_path)
    st.write(qs, runs, candidates=[{"name": "a"}, {"name": "b"}])
    return st, Y


def test_skewed_logging_policy_weighted_estimate_unbiased_unweighted_biased(tmp_path):
    from litellm_energy_router.training.baselines import make_baseline
    from litellm_energy_router.training.pairs import load_pairs

    n = 3000
    st, Y = _skewed_table(tmp_path, n, seed=3)
    p = load_pairs(st, ["a", "b"])
    st.close()
    truth = Y.mean(axis=0)  # every candidate's accuracy over all the queries (the counterfactual labels)
    for weighted in (True, False):
        m = p.matrix(unweighted=not weighted)
        est = make_baseline("task_prior").fit(m).predict_proba(m.subset([0]))[0]
        for k in range(2):
            rows = p.c == k
            w = p.weight[rows] if weighted else np.ones(rows.sum())
            y = p.y[rows]
            mu = np.average(y, weights=w)
            se = float(
                np.sqrt(np.sum(w**2 * (y - mu) ** 2)) / w.sum()
            )  # the (self-normalised) estimate's standard error
            assert est[k] == pytest.approx(mu, abs=se / 10)  # the baseline's estimate is that weighted mean
            if weighted:
                assert abs(est[k] - truth[k]) < 4 * se, (k, est[k], truth[k], se)
            else:
                assert abs(est[k] - truth[k]) > 4 * se, (k, est[k], truth[k], se)  # selection bias, beyond noise


def test_probe_fits_partial_rows_with_their_weights(tmp_path):
    """The probe fits on partial rows: a candidate's pooled intercept follows its weighted labels."""
    from litellm_energy_router.training.calibrate import fit_probe
    from litellm_energy_router.training.pairs import load_pairs

    st, Y = _skewed_table(tmp_path, 600, seed=5)
    p = load_pairs(st, ["a", "b"])
    st.close()
    m = p.matrix()
    emb = np.zeros((m.n, 4))
    emb[:, 0] = 1.0  # no signal in the embedding: the fit is the weighted log-odds
    for w, name in ((m.W, "weighted"), (p.matrix(unweighted=True).W, "unweighted")):
        probe = fit_probe(emb, m.Y, m.tasks, "none", C=1.0, weights=w)
        P = 1 / (1 + np.exp(-probe.logits(emb[:1], ["t"])[0]))
        target = [np.average(np.nan_to_num(m.Y[:, k])[w[:, k] > 0], weights=w[w[:, k] > 0, k]) for k in range(2)]
        assert np.allclose(P, target, atol=0.03), (name, P, target)


class _ConstEmbedder:
    """No signal in the text: every learned baseline must fall back to the (weighted) label means."""

    name = "const"

    def embed(self, texts):
        return np.full((len(texts), 4), 0.5, dtype=np.float32)


@pytest.mark.parametrize(
    "name,params", [("knn", {"k": 10_000, "shrink": 0.0}), ("logreg", {"C": 100.0}), ("mf", {"dim": 16, "l2": 3e-4})]
)
def test_baselines_fit_partial_rows_with_their_weights(tmp_path, name, params):
    from litellm_energy_router.training.baselines import make_baseline
    from litellm_energy_router.training.pairs import load_pairs

    st, _ = _skewed_table(tmp_path, 600, seed=7)
    p = load_pairs(st, ["a", "b"])
    st.close()
    for m in (p.matrix(), p.matrix(unweighted=True)):
        P = make_baseline(name, embedder=_ConstEmbedder(), **params).fit(m).predict_proba(m.subset([0]))[0]
        target = [np.average(np.nan_to_num(m.Y[:, k])[m.W[:, k] > 0], weights=m.W[m.W[:, k] > 0, k]) for k in range(2)]
        assert np.allclose(P, target, atol=0.02), (name, P, target)


def test_energy_estimate_prefers_measured_production_joules(tmp_path):
    from litellm_energy_router.training.data import load_matrix
    from litellm_energy_router.training.energy_fit import fit_energy_estimate
    from litellm_energy_router.training.pairs import MIN_MEASURED_RUNS, load_pairs

    rng = np.random.default_rng(0)
    n = MIN_MEASURED_RUNS + 10
    qs, runs = [], []
    for i in range(2 * n):
        qs.append(make_query(f"q{i}", "t", f"q {i}", source="import"))
        pt, ct = int(rng.integers(10, 200)), int(rng.integers(5, 100))
        if i < n:  # imported, profile-derived: 2 J per output token for both candidates
            for c, jo in (("s", 2.0), ("l", 8.0)):
                runs.append(
                    {
                        "query_id": f"q{i}",
                        "candidate": c,
                        "source": "import",
                        "score": 1.0,
                        "energy_j": 0.1 * pt + jo * ct,
                        "prompt_tokens": pt,
                        "completion_tokens": ct,
                        "energy_method": "estimate",
                    }
                )
        else:  # measured in production on `s` only: 6 J per output token (some not yet labelled)
            runs.append(
                {
                    **_prod(f"q{i}", "s", 1.0 if i % 3 else None, energy=0.1 * pt + 6.0 * ct),
                    "prompt_tokens": pt,
                    "completion_tokens": ct,
                    "energy_method": "nvml_counter",
                }
            )
    st = _store(tmp_path)
    st.write(qs, runs, candidates=[{"name": "s"}, {"name": "l"}])
    m, p = load_matrix(st), load_pairs(st)
    st.close()
    est = fit_energy_estimate(m, pairs=p)
    assert est.j_per_output_token["s"] == pytest.approx(6.0, rel=0.02)  # measured beats the profile-derived 2 J
    assert est.j_per_output_token["l"] == pytest.approx(8.0, rel=0.02)  # no measured runs: the table's
    assert fit_energy_estimate(m).j_per_output_token["s"] == pytest.approx(2.0, rel=0.02)  # complete queries alone
    fo = est.fitted_on
    assert (
        fo["s"]["j_per_token_from"] == "measured" and fo["s"]["measured_runs"] == n and fo["s"]["runs_production"] == n
    )
    assert fo["s"]["runs_import"] == n and fo["l"]["j_per_token_from"] == "table" and fo["l"]["measured_runs"] == 0
    few = p.exclude([f"q{i}" for i in range(n, 2 * n - MIN_MEASURED_RUNS + 1)])  # one measured run short
    assert fit_energy_estimate(m, pairs=few).fitted_on["s"]["j_per_token_from"] == "table"


def _extra_rows(n: int, start: int, cand: str):
    """Production-only queries of a new phrasing, labelled for one candidate only (always wrong)."""
    qs, runs = [], []
    for i in range(n):
        qid = f"p{start + i}"
        qs.append(
            make_query(
                qid, "synthetic", f"Summarise the {TOPICS[i % len(TOPICS)]} report {start + i}", source="production"
            )
        )
        runs.append(_prod(qid, cand, 0.0, energy=10.0, prop=0.8))
    return qs, runs


def test_one_candidate_production_rows_move_that_candidates_prediction(tmp_path):
    from litellm_energy_router.training.embed import embed_queries
    from litellm_energy_router.training.pipeline import TrainConfig, train

    from litellm_energy_router.router.checkpoint import read_manifest
    from litellm_energy_router.router.model import RouterModel
    from litellm_energy_router.router.probe import PROBE_FILE, Probe

    cands, queries, runs = planted_rows(60)
    probe_texts = [f"Summarise the {t} report {900 + i}" for i, t in enumerate(TOPICS)]
    tasks = ["synthetic"] * len(probe_texts)
    P: dict[str, dict[bool, np.ndarray]] = {"probe": {}, "lm": {}, "student": {}}
    for with_extra in (False, True):
        st = _store(tmp_path, f"t{int(with_extra)}.db")
        st.write(queries, runs, candidates=cands)
        if with_extra:
            st.write(*_extra_rows(40, 0, "small"))
        ck = train(st, tmp_path / f"ck{int(with_extra)}", TrainConfig.quick(), log=lambda s: None)
        st.close()
        q = Probe.load(ck / PROBE_FILE).logits(embed_queries(probe_texts), tasks)
        P["probe"][with_extra] = (1 / (1 + np.exp(-q))).mean(axis=0)
        P["lm"][with_extra] = (
            RouterModel(ck, scorer="lm").score(probe_texts, tasks).mean(axis=0)
        )  # calibrated LM + probe
        P["student"][with_extra] = RouterModel(ck).score(probe_texts, tasks).mean(axis=0)  # what serves
    small = CANDS.index("small")
    for name in ("probe", "lm"):
        moved = P[name][True] - P[name][False]
        others = np.delete(np.abs(moved), small)
        assert moved[small] < 0, (name, P[name])  # toward its labels (all wrong)
        assert -moved[small] > 3 * others.max(), (name, P[name])  # the others barely move
    # the student saw the production-only queries: it follows its teacher there (it extrapolated before)
    gap = {w: abs(P["student"][w][small] - P["lm"][w][small]) for w in (False, True)}
    assert gap[True] < gap[False], (P["student"], P["lm"])
    man = read_manifest(ck)
    assert man.watermark["queries"] == 60  # SFT / calibration: complete queries only
    assert man.watermark["pairs"]["pairs_production"] == 40 and man.watermark["pairs"]["queries"] == 100
    assert man.energy.fitted_on["small"]["runs_production"] == 40


def test_the_default_clip_keeps_uneven_exploration_unbiased():
    """Serving explores unevenly: a well-priced candidate keeps a tenth of a uniform share, so its explored rows log
    ε·0.1/K (1/p = 206 at ε = 0.1, K = 3). The clip at 100 cut exactly those rows and put a candidate of true
    accuracy 0.50 at 0.67; the weighted estimate is the true one again. The project's own functions throughout."""
    import random

    from litellm_energy_router.training.pairs import SOURCES, ips_weights

    from litellm_energy_router.router.online import OnlineEnergy, explore_pick, explore_weights

    on = OnlineEnergy(["A", "B", "C"], j_out=[1, 1, 1], j_prompt=[0, 0, 0], prior_tokens=[10, 10, 10])
    for _ in range(300):  # A and B well priced by production; C never served
        on.update("A", 10, 10, 10.0)
        on.update("B", 10, 10, 10.0)
    w = explore_weights(on.uncertainty(None))
    rng = random.Random(0)
    prop, y = [], []
    for i in range(60_000):  # half the queries the router sends to A (A right), half to B (A wrong)
        j, p = explore_pick(rng, 0.1, i % 2, w, 3)
        if j == 0:
            prop.append(p)
            y.append(1.0 if i % 2 == 0 else 0.0)
    prop, y = np.array(prop), np.array(y)
    assert 1 / prop.min() > 100  # the explored rows' weight, over the old clip
    src = np.full(len(prop), SOURCES.index("production"))
    wt, stats = ips_weights(src, prop, np.zeros(len(prop), int), ["v1"] * len(prop))
    assert stats["production_clipped"] == 0
    assert np.sum(wt * y) / np.sum(wt) == pytest.approx(0.5, abs=0.03) and y.mean() > 0.9
