"""Per-request energy and carbon figures through a real ``litellm.Router`` with the routing strategy and the
energy callback, a real OpenAI-compatible backend on 127.0.0.1 and an hourly intensity CSV: the decision's
estimates, the settled row (gCO2e = J x PUE x intensity of the deployment's site at that hour), LiteLLM's
standard logging payload and the ledger agree."""

from __future__ import annotations

import asyncio
import time

import litellm
import pytest
from litellm import Router
from litellm.integrations.custom_logger import CustomLogger
from router_fixtures import CANDS, loop_settings

from litellm_energy_router.demo.backend import LocalBackend as Backend
from litellm_energy_router.litellm_glue.callback import EnergyLogger
from litellm_energy_router.litellm_glue.figures import headers
from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy
from litellm_energy_router.table import open_store

pytestmark = [pytest.mark.litellm_integration, pytest.mark.usefixtures("fresh_litellm_callbacks")]
SITES = {"small": "north", "medium": "north", "large": "south"}


class PayloadSpy(CustomLogger):
    """Another logging integration: what it receives in the standard logging payload."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, dict] = {}

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        slo = kwargs["standard_logging_object"]
        self.seen[kwargs["litellm_call_id"]] = dict(slo["metadata"].get("energy_router") or {})


def test_figures_reach_row_payload_and_ledger(tmp_path, sqlite_url, planted_ckpt):
    csv = tmp_path / "intensity.csv"
    csv.write_text("region,hour,g_co2e_per_kwh\n" + "".join(f"N,{h},{100 + h}\nS,{h},{600 - h}\n" for h in range(24)))
    backend = Backend(delay_s=0.01).start()
    try:
        s = loop_settings(
            planted_ckpt,
            sqlite_url,
            tmp_path,
            carbon={
                "intensity_csv": str(csv),
                "sites": {"north": {"pue": 1.1, "region": "N"}, "south": {"pue": 1.4, "region": "S"}},
            },
        )
        model_list = [
            {
                "model_name": "pool",
                "litellm_params": {"model": f"openai/{c}", "api_base": backend.base(c), "api_key": "k"},
                "model_info": {"id": f"dep-{c}", "energy_router_site": SITES[c]},
            }
            for c in CANDS
        ]
        router = Router(model_list=model_list)
        strategy = EnergyRoutingStrategy(router, s)
        register_strategy(router, strategy)
        logger, spy = EnergyLogger(s), PayloadSpy()
        litellm.callbacks = [logger, spy]
        texts = [
            f"Give a proof about chess number {i}" if i % 2 else f"Tell me about rivers number {i}" for i in range(20)
        ]
        decisions = {}

        async def go():
            async def one(i, t):
                md = {"user_api_key_team_id": f"team-{i % 2}", "user_api_key_hash": f"{i % 2:064d}"}
                r = await router.acompletion(model="pool", messages=[{"role": "user", "content": t}], metadata=md)
                decisions[r._hidden_params["litellm_call_id"]] = md["energy_router_decision"]

            await asyncio.gather(*(one(i, t) for i, t in enumerate(texts)))
            while logger.writer.submitted < len(texts) or len(spy.seen) < len(texts):
                await asyncio.sleep(0.05)

        asyncio.run(go())
        time.sleep(0.3)
        assert logger.flush(30)
        logger.close()
    finally:
        backend.stop()
    store = open_store(sqlite_url)
    rows = {r["call_id"]: r for r in store.iter_runs()}
    assert set(rows) == set(decisions)
    for cid, d in decisions.items():
        r, f = rows[cid], d["figures"]
        e = d["energy_j"]
        assert f["joules_estimate"] == e[d["candidate"]] == r["energy_estimate_j"]
        assert f["reference"] == max(e, key=e.get) and f["joules_reference_estimate"] == r["energy_reference_j"]
        assert f["joules_saved_estimate"] == pytest.approx(
            f["joules_reference_estimate"] - f["joules_estimate"], abs=1e-3
        )
        site = SITES[r["candidate"]]
        assert f["site"] == r["site"] == site
        hour = int(r["created"] // 3600) % 24
        g = (100 + hour) * 1.1 if site == "north" else (600 - hour) * 1.4
        assert r["co2e_g"] == pytest.approx(r["energy_j"] / 3.6e6 * g)
        assert spy.seen[cid]["joules_estimate"] == f["joules_estimate"] and spy.seen[cid]["candidate"] == r["candidate"]
        h = headers(f)
        assert float(h["x-energy-router-joules-estimate"]) == pytest.approx(f["joules_estimate"], rel=1e-5)
    by_team = {x["team"]: x for x in store.ledger("team")}
    assert sum(x["requests"] for x in by_team.values()) == 20 and set(by_team) == {"team-0", "team-1"}
    # the simulated meter measures nothing: its joules are estimated in the ledger (the meter registry's answer)
    assert sum(x["joules_estimated"] for x in by_team.values()) == pytest.approx(
        sum(r["energy_j"] for r in rows.values())
    )
    assert sum(x["joules_measured"] for x in by_team.values()) == 0
    assert sum(x["co2e_g"] for x in by_team.values()) == pytest.approx(sum(r["co2e_g"] for r in rows.values()))
    store.close()


def test_the_default_reference_is_the_hungriest_candidate_the_model_group_deploys(tmp_path, sqlite_url, planted_ckpt):
    """A model group that deploys small and medium only: the savings are against medium (the pool's hungriest),
    not against large, which the checkpoint scores but this group cannot serve."""
    backend = Backend(delay_s=0.0).start()
    try:
        s = loop_settings(planted_ckpt, sqlite_url, tmp_path)
        model_list = [
            {
                "model_name": "cheap",
                "litellm_params": {"model": f"openai/{c}", "api_base": backend.base(c), "api_key": "k"},
                "model_info": {"id": f"dep-{c}"},
            }
            for c in ("small", "medium")
        ]
        router = Router(model_list=model_list)
        register_strategy(router, EnergyRoutingStrategy(router, s))
        md: dict = {}
        asyncio.run(router.acompletion(model="cheap", messages=[{"role": "user", "content": "rivers 1"}], metadata=md))
    finally:
        backend.stop()
    d = md["energy_router_decision"]
    assert "large" in d["energy_j"] and d["energy_j"]["large"] > d["energy_j"]["medium"]
    assert d["figures"]["reference"] == "medium"
    assert d["figures"]["joules_reference_estimate"] == d["energy_j"]["medium"]
