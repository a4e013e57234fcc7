"""EnergyLogger through a real ``litellm.Router`` and a real OpenAI-compatible HTTP backend on
127.0.0.1: one production row per served request, with the right deployment, tokens, latency and
energy; async (64 concurrent) and sync calls."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import litellm
import pytest
from router_fixtures import small_big_pool

from litellm_energy_router.demo.backend import LocalBackend, expected_usage
from litellm_energy_router.energy.profile import load_profile
from litellm_energy_router.litellm_glue.callback import EnergyLogger, query_id_for
from litellm_energy_router.litellm_glue.decision import DECISION_BOOK, Decision
from litellm_energy_router.settings import Settings
from litellm_energy_router.table import open_store, text_hash

# Real LiteLLM (Router / proxy / completion): also run at the oldest supported LiteLLM (make test-litellm-oldest).
pytestmark = [pytest.mark.litellm_integration, pytest.mark.usefixtures("fresh_litellm_callbacks")]

SMALL, BIG = "mistralai/mistral-7b-chat", "meta/llama-2-70b-chat"
CANDIDATES = [
    {"name": SMALL, "deployment_id": "dep-small", "params_b": 7},
    {"name": BIG, "deployment_id": "dep-big", "params_b": 70},
]
BY_ID = {"dep-small": SMALL, "dep-big": BIG}


def settings(url, tmp_path, meter="estimate", **extra):
    return Settings.model_validate(
        {
            "table": {"url": url},
            "energy": {"meter": meter},
            "candidates": CANDIDATES,
            "privacy": {"salt": "pepper"},
            "writer": {"spool_dir": str(tmp_path / "spool"), "flush_interval_s": 0.2},
            **extra,
        }
    )


def prompt(i: int) -> str:
    return f"question {i}: " + "word " * (i % 23)


def wait_submitted(logger: EnergyLogger, n: int, timeout: float = 60.0) -> None:
    """LiteLLM runs success callbacks in tasks/threads after the response returns."""
    deadline = time.monotonic() + timeout
    while logger.writer.submitted < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert logger.writer.submitted == n


@pytest.fixture
def backend():
    with LocalBackend(delay_s=0.02) as be:
        yield be


def check_rows(url, served, *, salt="pepper"):
    """served: call_id -> (model_id, prompt text, decision or None, wall latency s)."""
    store = open_store(url)
    rows = {r["call_id"]: r for r in store.iter_runs()}
    store.close()
    assert len(rows) == len(served)
    assert set(rows) == set(served)
    for call_id, (model_id, text, decision, wall) in served.items():
        r = rows[call_id]
        pt, ct = expected_usage(text)
        assert r["candidate"] == BY_ID[model_id]
        assert r["source"] == "production" and r["query_source"] == "production" and r["status"] == "success"
        assert r["query_id"] == query_id_for(call_id)
        assert r["text"] is None and r["text_hash"] == text_hash(text, salt)
        assert (r["prompt_tokens"], r["completion_tokens"]) == (pt, ct)
        assert 0.02 <= r["latency_s"] <= wall + 0.05
        assert r["score"] is None
        if decision is not None and decision.candidate == r["candidate"]:
            assert r["propensity"] == pytest.approx(decision.propensity)
        else:
            assert r["propensity"] is None
    return rows


@pytest.mark.slow
def test_async_2000_requests_64_concurrent(sqlite_url, tmp_path, backend):
    logger = EnergyLogger(settings(sqlite_url, tmp_path, meter="simulated"))
    attributor = logger.meter.primary.attributor
    litellm.callbacks = [logger]
    router = litellm.Router(model_list=small_big_pool(backend.base_url))
    served = {}

    async def one(i, sem):
        async with sem:
            text = prompt(i)
            md = {}
            decision = None
            if i % 2 == 0:
                decision = Decision(
                    candidate=SMALL if i % 4 == 0 else BIG, propensity=0.5 + (i % 5) / 10, router_version="v1"
                )
                DECISION_BOOK.put(md, decision)  # what a routing strategy in this process records
            t = time.time()
            resp = await router.acompletion(model="pool", messages=[{"role": "user", "content": text}], metadata=md)
            hp = resp._hidden_params
            served[hp["litellm_call_id"]] = (hp["model_id"], text, decision, time.time() - t)

    async def main():
        sem = asyncio.Semaphore(64)
        await asyncio.gather(*(one(i, sem) for i in range(2000)))
        # LiteLLM logs in tasks scheduled after each response: keep the loop alive until they ran
        deadline = time.monotonic() + 60
        while logger.writer.submitted < 2000 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    asyncio.run(main())
    wait_submitted(logger, 2000)
    # the writer writes a row once its energy settles (the meter past the request's end); a flush forces
    # the unsettled ones with what is known, which under load can leave a request's last interval out
    deadline = time.monotonic() + 45
    while logger.writer.accounted < 2000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert logger.flush(60)
    rows = check_rows(sqlite_url, served)
    logger.close()
    energies = [r["energy_j"] for r in rows.values()]
    assert all(r["energy_method"] == "simulated" and r["gpu"] == "simulated GPU" for r in rows.values())
    assert all(e is not None and e >= 0 for e in energies)
    assert sum(e > 0 for e in energies) >= 1990
    # energy conservation through the whole path: rows' joules + idle == the meter over the run
    tot = attributor.totals()
    assert abs(sum(energies) + tot.idle_j - tot.meter_j) / tot.meter_j < 0.01
    assert {r["candidate"] for r in rows.values()} == {SMALL, BIG}


@pytest.mark.slow
def test_sync_2000_requests(sqlite_url, tmp_path, backend):
    logger = EnergyLogger(settings(sqlite_url, tmp_path, meter="estimate"))
    litellm.callbacks = [logger]
    router = litellm.Router(model_list=small_big_pool(backend.base_url))
    profile = load_profile()
    served = {}

    def one(i):
        text = prompt(i)
        t = time.time()
        resp = router.completion(model="pool", messages=[{"role": "user", "content": text}])
        hp = resp._hidden_params
        served[hp["litellm_call_id"]] = (hp["model_id"], text, None, time.time() - t)

    with ThreadPoolExecutor(16) as ex:
        list(ex.map(one, range(2000)))
    wait_submitted(logger, 2000)
    assert logger.flush(60)
    rows = check_rows(sqlite_url, served)
    logger.close()
    for call_id, (model_id, text, _, _) in served.items():
        r = rows[call_id]
        pt, ct = expected_usage(text)
        assert r["energy_method"] == "estimate"
        assert r["energy_j"] == pytest.approx(profile.estimate_j(BY_ID[model_id], pt, ct))


def test_failures_and_store_text(sqlite_url, tmp_path):
    """Backend errors become ``status=failure`` rows; with store_text the query text is kept."""
    with LocalBackend(delay_s=0.0, fail_every=3) as be:
        s = settings(sqlite_url, tmp_path, privacy={"store_text": True, "salt": ""})
        logger = EnergyLogger(s)
        litellm.callbacks = [logger]
        router = litellm.Router(model_list=small_big_pool(be.base_url), num_retries=0)

        async def main():
            out = []
            for i in range(15):
                try:
                    await router.acompletion(model="pool", messages=[{"role": "user", "content": prompt(i)}])
                    out.append("ok")
                except Exception:  # noqa: BLE001
                    out.append("err")
            while logger.writer.submitted < 15:
                await asyncio.sleep(0.05)
            return out

        outcomes = asyncio.run(main())
        for i in range(15, 30):  # sync calls: the sync success/failure hooks
            try:
                router.completion(model="pool", messages=[{"role": "user", "content": prompt(i)}])
                outcomes.append("ok")
            except Exception:  # noqa: BLE001
                outcomes.append("err")
        wait_submitted(logger, 30)
        assert logger.flush(30)
        logger.close()
    store = open_store(sqlite_url)
    rows = list(store.iter_runs())
    store.close()
    assert len(rows) == 30
    assert sum(r["status"] == "failure" for r in rows) == outcomes.count("err") == 10
    assert all(r["text"] is not None and r["text"].startswith("question ") for r in rows)
    assert all(r["candidate"] in (SMALL, BIG) for r in rows)
