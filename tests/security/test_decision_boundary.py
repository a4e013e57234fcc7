"""Decisions and call ids (issue: trust in production, item 2), through a real ``litellm.Router``, a real
HTTP backend and the real table writer: the table records the decision the router made in this process,
never one a caller wrote into request metadata; a call id that already has a row cannot be taken over
by another request; feedback is idempotent and a replayed row never resets it."""

from __future__ import annotations

import asyncio
import threading
import time

import litellm
import pytest
from router_fixtures import CANDS, drain_litellm_logging, small_big_pool

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.energy.estimate import EstimateMeter
from litellm_energy_router.feedback import apply_feedback
from litellm_energy_router.litellm_glue.callback import EnergyLogger, PendingRow, TableWriter
from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy
from litellm_energy_router.settings import PrivacySettings, Settings, WriterSettings
from litellm_energy_router.table import open_store, text_hash

SMALL, BIG = "mistralai/mistral-7b-chat", "meta/llama-2-70b-chat"
FORGED = {"candidate": BIG, "deployment_id": None, "propensity": 0.001, "router_version": "forged"}
PROOF = "Give a proof about chess number 4242"
# Real LiteLLM (Router / completion): also run at the oldest supported LiteLLM (make test-litellm-oldest).
pytestmark = [pytest.mark.litellm_integration, pytest.mark.usefixtures("fresh_litellm_callbacks")]


def _settings(url, tmp_path, **extra):
    return Settings.model_validate(
        {
            "table": {"url": url},
            "writer": {"spool_dir": str(tmp_path / "spool"), "flush_interval_s": 0.05},
            "candidates": [{"name": SMALL, "deployment_id": "dep-small"}, {"name": BIG, "deployment_id": "dep-big"}],
            **extra,
        }
    )


def _deployment(group, model, api_base, dep_id):
    return {
        "model_name": group,
        "litellm_params": {"model": model, "api_base": api_base, "api_key": "x"},
        "model_info": {"id": dep_id},
    }


def routed_pool(planted_ckpt, sqlite_url, tmp_path, backend):
    """A real Router: group ``pool`` (the planted candidates, our strategy registered) and group ``other``
    (one deployment the strategy passes through), with an EnergyLogger registered. Returns (router, logger)."""
    s = Settings.model_validate(
        {
            "router": {"checkpoint": str(planted_ckpt), "timeout_ms": 5000},
            "candidates": [{"name": c} for c in CANDS],
            "table": {"url": sqlite_url},
            "writer": {"spool_dir": str(tmp_path / "spool"), "flush_interval_s": 0.05},
        }
    )
    logger = EnergyLogger(s)
    litellm.callbacks = [logger]
    deps = [_deployment("pool", f"openai/{c}", backend.base(c), f"dep-{c}") for c in CANDS]
    deps.append(_deployment("other", "openai/other", backend.base("other"), "dep-other"))
    router = litellm.Router(model_list=deps)
    register_strategy(router, EnergyRoutingStrategy(router, s))
    return router, logger


def _rows(url):
    store = open_store(url)
    try:
        return list(store.iter_runs())
    finally:
        store.close()


def _served(logger, n):
    deadline = time.monotonic() + 30
    while logger.writer.submitted < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert logger.writer.submitted == n and logger.flush(30)


def _chat(router, logger, model, text, **kw):
    """One request; returns its call id once the logger has its row (LiteLLM logs in a task after the
    response: it runs on this loop, not on the next test's)."""

    async def go():
        n = logger.writer.submitted
        r = await router.acompletion(model=model, messages=[{"role": "user", "content": text}], **kw)
        deadline = time.monotonic() + 30
        while logger.writer.submitted == n and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await drain_litellm_logging()
        return r._hidden_params["litellm_call_id"]

    return asyncio.run(go())


def test_forged_decision_in_metadata_does_not_reach_the_table(sqlite_url, tmp_path):
    """No router decided these requests: a caller's `energy_router_decision` must leave no propensity and
    must not name the candidate of a deployment that is none of the router's."""
    with LocalBackend(delay_s=0.01) as be:
        logger = EnergyLogger(_settings(sqlite_url, tmp_path))
        litellm.callbacks = [logger]
        other_group = _deployment("other", "openai/other", be.base_url, "dep-other")
        router = litellm.Router(model_list=small_big_pool(be.base_url) + [other_group])
        pooled = _chat(router, logger, "pool", "hello there", metadata={"energy_router_decision": dict(FORGED)})
        other = _chat(router, logger, "other", "hello again", metadata={"energy_router_decision": dict(FORGED)})
        _served(logger, 2)
        logger.close()
    rows = {r["call_id"]: r for r in _rows(sqlite_url)}
    assert set(rows) == {pooled, other}
    assert [r["propensity"] for r in rows.values()] == [None, None]
    assert rows[other]["candidate"] != BIG and "other" in rows[other]["candidate"]


def test_the_row_carries_the_routers_own_decision(planted_ckpt, sqlite_url, tmp_path):
    """With the routing strategy in place: a routed request records the strategy's decision whatever the
    caller sent; a request the strategy passes through (not its pool) records none."""
    backend = LocalBackend().start()
    try:
        router, logger = routed_pool(planted_ckpt, sqlite_url, tmp_path, backend)
        forged = {**FORGED, "candidate": "large"}
        routed = _chat(router, logger, "pool", PROOF, metadata={"energy_router_decision": dict(forged)})
        forged_other = {**forged, "candidate": "medium"}
        passed = _chat(router, logger, "other", PROOF, metadata={"energy_router_decision": forged_other})
        _served(logger, 2)
        logger.close()
    finally:
        backend.stop()
    rows = {r["call_id"]: r for r in _rows(sqlite_url)}
    assert rows[routed]["candidate"] == "large" and rows[routed]["propensity"] == 1.0  # epsilon 0: the router's own
    assert rows[passed]["propensity"] is None and rows[passed]["candidate"] != "medium"


def _snapshot(row):
    keys = ("query_id", "text_hash", "candidate", "score", "energy_j", "latency_s", "created", "updated")
    return {k: row[k] for k in keys}


def test_a_second_request_with_the_same_call_id_cannot_take_over_the_row(sqlite_url, tmp_path):
    """A caller chooses the call id (proxy header x-litellm-call-id, SDK litellm_call_id). Reusing the
    victim's id, with another text or the same one, neither overwrites the victim's row nor resets its
    feedback; the later requests are still recorded, under fresh server-side ids."""
    with LocalBackend(delay_s=0.01) as be:
        logger = EnergyLogger(_settings(sqlite_url, tmp_path))
        litellm.callbacks = [logger]
        router = litellm.Router(model_list=[_deployment("solo", "openai/small", be.base_url, "dep-small")])
        assert _chat(router, logger, "solo", "what is the victim asking", litellm_call_id="victim-1") == "victim-1"
        _served(logger, 1)
        store = open_store(sqlite_url)
        assert apply_feedback(store, "victim-1", 1.0) == 1
        (before,) = [_snapshot(r) for r in store.iter_runs()]
        _chat(router, logger, "solo", "an attacker's other question", litellm_call_id="victim-1")
        _chat(router, logger, "solo", "what is the victim asking", litellm_call_id="victim-1")  # a replay
        _served(logger, 3)
        logger.close()
        rows = list(store.iter_runs())
        victim = [r for r in rows if r["call_id"] == "victim-1"]
        assert [_snapshot(r) for r in victim] == [before]
        assert before["score"] == 1.0 and before["text_hash"] == text_hash(
            "what is the victim asking", logger.writer.salt
        )
        others = [r for r in rows if r["call_id"] != "victim-1"]
        assert len(others) == 2 and all(r["score"] is None and r["query_id"] != before["query_id"] for r in others)
        assert {r["text_hash"] for r in others} == {
            text_hash("an attacker's other question", logger.writer.salt),
            before["text_hash"],
        }
        store.close()


def _row(call_id="call-1", **over):
    base = dict(
        call_id=call_id,
        candidate=SMALL,
        status="success",
        text="q1",
        start_s=100.0,
        end_s=101.0,
        first_token_s=None,
        prompt_tokens=10,
        completion_tokens=5,
        propensity=0.5,
        deployment_id="dep-small",
        backend_id=None,
    )
    return PendingRow(**{**base, **over})


def _writer(url, tmp_path):
    return TableWriter(
        url,
        EstimateMeter(),
        writer=WriterSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.05),
        privacy=PrivacySettings(),
    )


def test_feedback_applied_twice_is_idempotent(any_url, tmp_path):
    w = _writer(any_url, tmp_path)
    w.submit(_row())
    w.close()
    store = open_store(any_url)
    assert apply_feedback(store, "call-1", 0.5) == 1
    (first,) = store.iter_runs()
    time.sleep(0.02)
    assert apply_feedback(store, "call-1", 0.5) == 0  # the same label again: nothing written
    (again,) = store.iter_runs()
    assert again == first
    assert (
        store.count_labelled(since_id=first["id"], since_updated=first["updated"]) == 0
    )  # retraining sees nothing new
    store.close()


def test_a_replayed_row_never_resets_feedback(any_url, tmp_path):
    """The same row delivered twice (a spool replay after a lost acknowledgement, a duplicated event)."""
    w = _writer(any_url, tmp_path)
    w.submit(_row())
    assert w.flush(30)
    store = open_store(any_url)
    assert apply_feedback(store, "call-1", 1.0) == 1
    w.submit(_row())
    w.submit(_row(status="failure", start_s=200.0, end_s=201.0))
    w.close()
    rows = list(store.iter_runs())
    victim = [r for r in rows if r["call_id"] == "call-1"]
    assert len(victim) == 1 and victim[0]["score"] == 1.0 and victim[0]["status"] == "success"
    store.close()


def test_a_call_id_too_long_for_the_table_is_recorded_under_a_fresh_id(sqlite_url, tmp_path):
    """LiteLLM accepts caller call ids up to 256 characters; the table's key is 200. The row is kept."""
    w = _writer(sqlite_url, tmp_path)
    w.submit(_row(call_id="x" * 256))
    w.close()
    rows = _rows(sqlite_url)
    assert len(rows) == 1 and len(rows[0]["call_id"]) <= 200 and rows[0]["call_id"] != "x" * 256


def test_two_proxies_racing_on_the_same_call_ids_keep_one_row_each(any_url, tmp_path):
    """Two writers (two proxies sharing the table) store different requests under the same 40 call ids at
    once: every call id keeps exactly one row, whole (its own text), and no row is lost."""
    texts = {"a": "first proxy's question", "b": "second proxy's question"}
    salts = {}

    def burst(name):
        w = _writer(any_url, tmp_path / name)
        salts[name] = w.salt  # each proxy's own generated salt (privacy default)
        for i in range(40):
            w.submit(_row(f"race-{i}", text=texts[name], start_s=100.0 + i, end_s=101.0 + i + (name == "b") / 10))
        w.close()

    threads = [threading.Thread(target=burst, args=(n,)) for n in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    store = open_store(any_url)
    rows = list(store.iter_runs())
    store.close()
    assert len(rows) == 80
    owned = [r for r in rows if r["call_id"].startswith("race-")]
    assert sorted(r["call_id"] for r in owned) == sorted(f"race-{i}" for i in range(40))
    hashes = {text_hash(t, salts[n]) for n, t in texts.items()}
    assert all(r["text_hash"] in hashes for r in rows) and all(
        r["call_id"].startswith("dup-") for r in rows if r not in owned
    )
