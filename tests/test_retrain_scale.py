"""``retrain`` on a table larger than its budget: it trains on a stratified sample, caches embeddings
across runs, and reports rows read, the sample, stage timings and peak memory."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from litellm_energy_router.training.retrain import RetrainConfig, run_retrain
from litellm_energy_router.training.sampling import TrainingBudget
from router_fixtures import planted_rows

from litellm_energy_router.table import make_query, open_store


def _add(url: str, prefix: str, n: int, task: str) -> None:
    cands, queries, runs = planted_rows(n, prefix=prefix)
    # each batch its own texts (identical queries share a split group: the same text under two ids is one query)
    queries = [make_query(q.id, task, f"{q.text} ({prefix})", source=q.source) for q in queries]
    with open_store(url) as store:
        store.write(queries, runs, candidates=cands)


def test_retrain_over_budget_trains_on_a_stratified_sample_and_reports_it(tmp_path: Path, sqlite_url: str):
    _add(sqlite_url, "a", 240, "big")
    _add(sqlite_url, "b", 30, "small")
    budget = TrainingBudget(max_queries=60, min_per_stratum=12)
    cfg = RetrainConfig(
        table_url=sqlite_url,
        pointer=tmp_path / "current.json",
        quick=True,
        min_new_rows=10,
        holdout_fraction=0.25,
        lam=0.3,
        epsilon=0.0,
        budget=budget,
    )
    first = run_retrain(cfg, log=lambda s: None)
    assert first.status == "promoted"
    rep = json.loads(first.report_json.read_text())
    data = rep["data"]
    assert data["rows_read"] == 270 * 3 and data["table_queries"] == 270
    s = data["sample"]
    assert s["sampled"] < 270 and set(s["strata"]) == {"big", "small"}
    assert s["strata"]["small"]["sampled"] >= 12  # the small task keeps its floor
    assert rep["train_queries"] < 270 * 0.75
    stages = rep["timings"]["stages"]
    assert {"read table", "sample", "held-out split", "train", "compare"} <= set(stages)
    assert rep["timings"]["peak_rss_mb"] > 0 and all(v["seconds"] >= 0 for v in stages.values())
    md = first.report_md.read_text()
    assert "peak RSS" in md and "sampled" in md
    cache = tmp_path / "versions" / "embed-cache"
    shards = sorted(cache.rglob("*.npz"))
    assert shards  # the probe's embeddings went to the retrain's cache

    _add(sqlite_url, "c", 60, "big")  # new rows; the serving checkpoint now scores uncertainty
    second = run_retrain(cfg, log=lambda s: None)
    rep2 = json.loads(second.report_json.read_text())
    assert "score uncertainty" in rep2["timings"]["stages"]
    assert rep2["data"]["table_queries"] == 330

    _add(sqlite_url, "d", 40, "small")  # a warm start trains on the new queries plus a replay of old ones
    warm = run_retrain(
        cfg.model_copy(update={"warm_start": True, "budget": budget.model_copy(update={"replay_ratio": 1.0})}),
        log=lambda s: None,
    )
    rep3 = json.loads(warm.report_json.read_text())
    s3 = rep3["data"]["sample"]
    assert rep3["data"]["table_queries"] == 370
    new = sum(v["sampled"] for k, v in s3["strata"].items() if k.endswith("|new"))
    old = sum(v["sampled"] for k, v in s3["strata"].items() if k.endswith("|old"))
    # every new query; as many old ones replayed (more only by the per-task floor)
    assert new == 40 and 40 <= old <= 40 + 2 * budget.min_per_stratum
    assert rep3["train_queries"] < 80


def test_retrain_reads_the_table_once(tmp_path: Path, sqlite_url: str, monkeypatch):
    """The training matrix and the partial-feedback pairs come from one pass over the table; the only
    other read is the off-policy estimate's, of production rows only (capped by ``ope_max_rows``)."""
    from litellm_energy_router.table import store as store_mod

    _add(sqlite_url, "a", 80, "t")
    with open_store(sqlite_url) as st:  # a few production rows: one candidate each, with a propensity
        cands, queries, runs = planted_rows(20, prefix="p")
        prod = [
            {**r, "source": "production", "propensity": 0.5, "call_id": f"c{i}"}
            for i, r in enumerate(runs)
            if r["candidate"] == cands[0]["name"]
        ]
        st.write([q.model_copy(update={"source": "production"}) for q in queries], prod)
    reads: list[tuple[str, ...] | None] = []
    real = store_mod.SQLStore.iter_runs

    caller = threading.current_thread()

    def counted(self, *a, **kw):  # this thread's reads: a serving core another test left running reads its own table
        if threading.current_thread() is caller:
            reads.append(tuple(kw["sources"]) if kw.get("sources") else None)
        return real(self, *a, **kw)

    monkeypatch.setattr(store_mod.SQLStore, "iter_runs", counted)
    cfg = RetrainConfig(
        table_url=sqlite_url,
        pointer=tmp_path / "current.json",
        quick=True,
        min_new_rows=10,
        holdout_fraction=0.25,
        lam=0.3,
        epsilon=0.0,
    )
    res = run_retrain(cfg, log=lambda s: None)
    assert res.status == "promoted"
    assert reads == [tuple(cfg.sources), ("production",)], reads
    rep = json.loads(res.report_json.read_text())
    assert rep["data"]["rows_read"] == 80 * 3 + len(prod)
    assert rep["data"]["pairs"]["partial_queries"] == 20  # the production-only queries reached training
