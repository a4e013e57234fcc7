"""Model selection: on a table where only the task matters, retrain promotes a baseline (not the LM router)
and writes the choice, its margin and the fold spread into the report and the manifest; the stacked
scorer served from its checkpoint gives the P the evaluation computed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from litellm_energy_router.training.data import load_matrix
from litellm_energy_router.training.retrain import RetrainConfig, run_retrain
from litellm_energy_router.training.selection import Stacked, check_scorers, cross_fit_stack, export_stacked, fit_stack
from router_fixtures import planted_rows

from litellm_energy_router.router.checkpoint import read_manifest, resolve
from litellm_energy_router.router.scoring import load_scorer
from litellm_energy_router.table import make_query, open_store

CANDS = ["small", "medium", "large"]
ENERGY = {"small": 10.0, "medium": 30.0, "large": 90.0}
# success rate per (task, candidate): the task decides everything, the text carries nothing
RATE = {"algebra": (0.1, 0.5, 0.9), "trivia": (0.85, 0.9, 0.95), "code": (0.2, 0.8, 0.85)}
WORDS = ["apples", "rivers", "music", "trains", "clouds", "bread", "chess", "paint", "glass", "birds", "ropes", "lamps"]


def _task_only_rows(n: int = 150, seed: int = 0):
    rng = np.random.default_rng(seed)
    queries, runs = [], []
    for i in range(n):
        task = list(RATE)[i % 3]
        text = f"Question {i}: " + " ".join(rng.choice(WORDS, size=6)) + "?"
        q = make_query(f"t{i:04d}", task, text, source="tournament")
        queries.append(q)
        for c, p in zip(CANDS, RATE[task]):
            runs.append(
                {
                    "query_id": q.id,
                    "candidate": c,
                    "source": "tournament",
                    "score": float(rng.random() < p),
                    "energy_j": ENERGY[c] * (1 + 0.1 * rng.random()),
                    "prompt_tokens": 12,
                    "completion_tokens": 20,
                }
            )
    return [{"name": c} for c in CANDS], queries, runs


def test_retrain_promotes_the_baseline_the_cv_proves_best_with_margin_and_spread(tmp_path, sqlite_url):
    store = open_store(sqlite_url)
    cands, queries, runs = _task_only_rows()
    store.write(queries, runs, candidates=cands)
    store.close()
    cfg = RetrainConfig(
        table_url=sqlite_url,
        pointer=tmp_path / "current.json",
        quick=True,
        min_new_rows=10,
        holdout_fraction=0.2,
        lam=0.3,
        epsilon=0.0,
        select=True,
        select_folds=3,
        select_scorers=["router", "task_prior", "knn", "logreg", "stacked"],
    )
    res = run_retrain(cfg, log=lambda s: None)
    assert res.status == "promoted"
    sel = json.loads(res.report_json.read_text())["selection"]
    scores = {name: r["aiq"] for name, r in sel["scorers"].items()}
    assert set(scores) == {"router", "task_prior", "knn", "logreg", "stacked"}
    # the chosen one has the best held-out AIQ, and it is not the LM router on a table whose text says nothing
    assert sel["chosen"] != "router" and scores[sel["chosen"]] == max(scores.values())
    assert scores["router"] < scores[sel["chosen"]]
    assert sel["margin_aiq"] == pytest.approx(scores[sel["chosen"]] - scores[sel["runner_up"]])
    assert sel["paired_fold_delta_sd"] is not None and sel["scorers"]["task_prior"]["aiq_fold_sd"] > 0
    # the promoted checkpoint serves the chosen scorer, and its manifest carries the selection
    ck = resolve(cfg.pointer)
    manifest = read_manifest(ck)
    assert manifest.scorer == sel["chosen"] and manifest.selection["chosen"] == sel["chosen"]
    served = load_scorer(cfg.pointer)
    assert served.name == sel["chosen"]
    P = served.score(["Question 9999: apples rivers?"] * 3, list(RATE))
    assert P.shape == (3, 3)
    assert P[0, 0] < P[0, 2]  # algebra: large is far likelier than small to answer
    # a task the table never saw: the pooled prior (the leave-task-out fallback), not the text model
    np.testing.assert_allclose(
        served.score(["Question 9999: apples rivers?"], ["never-seen"])[0], served.arrays["prior_any"]
    )
    assert manifest.baseline["unknown_task"] == "prior"
    md = res.report_md.read_text()
    assert "← promoted" in md and sel["chosen"] in md


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    d = tmp_path_factory.mktemp("st")
    store = open_store(f"sqlite:///{d / 't.db'}")
    cands, queries, runs = planted_rows(80, seed=2)
    store.write(queries, runs, candidates=cands)
    m = load_matrix(store)
    store.close()
    return m


def test_stacked_scorer_served_from_its_checkpoint_gives_the_evaluations_p(planted, tmp_path):
    idx = np.arange(planted.n)
    train, test = planted.take(idx[idx % 4 != 0]), planted.take(idx[idx % 4 == 0])
    st = Stacked().fit(train)
    expected = st.predict_proba(test)
    ck = export_stacked(train, tmp_path / "stacked", stack_w=st.stack_w)
    served = load_scorer(ck)
    assert served.name == "stacked" and read_manifest(ck).baseline["kind"] == "stacked"
    np.testing.assert_allclose(served.score(list(test.texts), list(test.tasks)), expected, atol=1e-6)
    # the planted rule (only `large` proves) is what the stack learned
    hard = np.array(["proof" in t for t in test.texts])
    assert expected[hard, 0].mean() < 0.5 < expected[~hard, 0].mean()
    # an unseen task is served (pooled prior inside the bases), not refused
    assert served.score(["Give a proof about rivers"], ["never-seen"]).shape == (1, 3)


def test_stack_weights_follow_the_informative_base_and_cross_fitting_is_out_of_fold():
    rng = np.random.default_rng(0)
    n, K = 400, 2
    Y = (rng.random((n, K)) < 0.5).astype(float)
    good = np.clip(0.8 * Y + 0.1 + 0.05 * rng.standard_normal((n, K)), 0.01, 0.99)
    noise = rng.random((n, K))
    w = fit_stack([good, noise], Y)
    assert w.shape == (K, 3) and (w[:, 0] > 5 * np.abs(w[:, 1])).all()
    splits = [(np.flatnonzero(np.arange(n) % 4 != f), np.flatnonzero(np.arange(n) % 4 == f)) for f in range(4)]
    P = cross_fit_stack({"good": good, "noise": noise}, Y, splits, ["good", "noise"])
    assert not np.isnan(P).any() and np.mean((P - Y) ** 2) < np.mean((noise - Y) ** 2)


def test_unknown_scorer_names_are_refused_in_one_line():
    with pytest.raises(ValueError, match="scorer 'gpt' : not selectable|scorer 'gpt': not selectable"):
        check_scorers(["knn", "gpt"])
    with pytest.raises(ValueError):
        RetrainConfig(table_url="sqlite://", pointer="p.json", select_scorers=["knn", "knn"])


def test_token_model_learns_per_query_output_length_and_serves_the_same_offsets(tmp_path):
    from litellm_energy_router.training.data import TableMatrix
    from litellm_energy_router.training.token_fit import fit_token_model, token_errors

    from litellm_energy_router.router.token_model import TokenModel

    rng = np.random.default_rng(0)
    n = 240
    long_ = np.array([i % 2 == 0 for i in range(n)])
    texts = [
        ("Write a long essay about " if lg else "Say yes or no: ") + " ".join(rng.choice(WORDS, size=4)) for lg in long_
    ]
    tasks = np.array(["code" if i < 160 else "quiz" for i in range(n)], dtype=object)
    T = np.where(long_[:, None], 300.0, 20.0) + rng.normal(0, 5, (n, 2))
    T[tasks == "quiz"] = 2.0  # constant lengths: the mean is the model
    m = TableMatrix(
        candidates=["a", "b"],
        ids=np.array([f"q{i}" for i in range(n)], dtype=object),
        tasks=tasks,
        texts=texts,
        prompt_tokens=np.full(n, 12.0),
        Y=np.ones((n, 2)),
        E=T * 0.1,
        T=T,
    )
    splits = [(np.flatnonzero(np.arange(n) % 4 != f), np.flatnonzero(np.arange(n) % 4 == f)) for f in range(4)]
    errs, off = token_errors(m, splits)
    assert all(e["mae_model"] < 0.5 * e["mae_task_mean"] for e in errs.values())
    assert not off[tasks == "quiz"].any()  # constant-length task: no offset
    tm, info = fit_token_model(m)
    assert info["code"]["a"]["alpha"] is not None and info["quiz"]["a"]["alpha"] is None
    tm.save(tmp_path / "tokens.npz")
    served = TokenModel.load(tmp_path / "tokens.npz")
    code = list(np.flatnonzero(tasks == "code")[:6])
    got = served.offset([texts[i] for i in code], [12.0] * 6, ["code"] * 6)
    np.testing.assert_allclose(got, tm.offset([texts[i] for i in code], [12.0] * 6, ["code"] * 6))
    assert (got[long_[code]] > 100).all() and (got[~long_[code]] < -100).all()
    assert not served.offset([texts[0]], [12.0], ["never-seen"]).any()  # an unseen task keeps the mean


def test_fewer_training_queries_than_folds_is_one_line(planted):
    """``select_folds`` above the training queries: one line naming both (a ValueError traceback before)."""
    from litellm_energy_router.training.data import MatrixError
    from litellm_energy_router.training.selection import select

    with pytest.raises(MatrixError, match=r"3 training queries cannot make 5 folds"):
        select(planted.take(np.arange(3)), ["task_prior"], folds=5)
