"""Objective carbon (knob ``objective``): the decision rule weighs Ê x carbon factor in reference grams, and
through a real ``litellm.Router`` the same model served in two sites goes to the cleaner grid at that hour."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from litellm import Router
from router_fixtures import CANDS

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.energy.carbon import CarbonModel, CarbonSettings
from litellm_energy_router.knob import Knob, KnobError, resolve_knob
from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
from litellm_energy_router.litellm_glue.strategy import EnergyRoutingStrategy
from litellm_energy_router.router.decide import decide
from litellm_energy_router.settings import Settings

P = np.array([[0.9, 0.6]])
E = np.array([[100.0, 20.0]])  # J


def test_decide_weighs_carbon_only_under_the_carbon_objective():
    joules, carbon = Knob.point(lambda_=0.2), Knob.point(lambda_=0.2, objective="carbon")
    dirty, clean = np.array([[3.0, 3.0]]), np.array([[0.5, 0.5]])
    assert decide(P, E, joules)[0] == 0  # 0.9 - 0.2 > 0.6 - 0.04
    assert decide(P, E, joules, dirty)[0] == 0  # the joules objective ignores the factors
    assert decide(P, E, carbon, dirty)[0] == 1  # at 3 reference grams per reference joule the cheap one wins
    assert decide(P, E, carbon, clean)[0] == 0
    assert decide(P, E, carbon)[0] == 0  # no factors (no sites): joules
    # max_energy_j still bounds joules, whatever the grid: candidate 0 (100 J) is out although it is cleaner
    assert decide(P, E, Knob.point(lambda_=0.0, objective="carbon", max_energy_j=50.0), np.array([[0.1, 10.0]]))[0] == 1


def test_reference_gram_and_request_objective(tmp_path):
    cm = CarbonModel(CarbonSettings(sites={"x": {"pue": 1.5, "intensity_g_per_kwh": 200.0}}, reference_g_per_kwh=400.0))
    assert cm.factor("x", 0.0) == pytest.approx(1.5 * 200 / 400) and cm.factor(None, 0.0) is None
    s = Settings.model_validate({"knob": {"per_key": {"green": {"objective": "carbon"}}}})
    assert resolve_knob(s.knob, {"metadata": {"user_api_key_alias": "green"}}).objective == "carbon"
    assert resolve_knob(s.knob, {"metadata": {"energy_router": {"objective": "carbon"}}}).objective == "carbon"
    with pytest.raises(KnobError, match=r"metadata\.energy_router\.objective = 'watts'"):
        resolve_knob(s.knob, {"metadata": {"energy_router": {"objective": "watts"}}})


def _hour() -> int:
    return int(time.time() // 3600) % 24


@pytest.mark.litellm_integration
@pytest.mark.usefixtures("fresh_litellm_callbacks")
def test_same_model_in_two_sites_goes_to_the_cleaner_grid_at_that_hour(tmp_path, planted_ckpt):
    csv = tmp_path / "grid.csv"  # north is clean on even hours, south on odd ones
    lines = [f"N,{h},{100 if h % 2 == 0 else 500}\nS,{h},{500 if h % 2 == 0 else 100}\n" for h in range(24)]
    csv.write_text("region,hour,g_co2e_per_kwh\n" + "".join(lines))
    s = Settings.model_validate(
        {
            "router": {"checkpoint": str(planted_ckpt), "timeout_ms": 5000},
            "candidates": [{"name": c} for c in CANDS],
            "knob": {"lambda": 0.05},
            "table": {"url": f"sqlite:///{tmp_path / 't.db'}"},
            "carbon": {"intensity_csv": str(csv), "sites": {"north": {"region": "N"}, "south": {"region": "S"}}},
        }
    )
    with LocalBackend() as backend:
        ml = [
            {
                "model_name": "pool",
                "litellm_params": {"model": f"openai/{c}", "api_base": backend.base(c), "api_key": "k"},
                "model_info": {"id": f"{c}@{site}", "energy_router_candidate": c, "energy_router_site": site},
            }
            for c in CANDS
            for site in ("north", "south")
        ]
        router = Router(model_list=ml)
        strategy = EnergyRoutingStrategy(router, s)
        register_strategy(router, strategy)

        async def go(objective: str) -> list[tuple[int, int, str]]:
            out = []
            for i in range(20):
                md = {"energy_router": {"objective": objective}}
                h0 = _hour()
                msgs = [{"role": "user", "content": f"Give a proof about glass number {i}"}]
                r = await router.acompletion(model="pool", messages=msgs, metadata=md)
                out.append((h0, _hour(), r._hidden_params["model_id"]))
            return out

        carbon, joules = asyncio.run(go("carbon")), asyncio.run(go("joules"))
        strategy.core.runtime.close()
    cleaner = {h: "north" if h % 2 == 0 else "south" for h in range(24)}
    checked = [(h0, dep) for h0, h1, dep in carbon if h0 == h1]  # a request that crossed the hour is not judged
    assert len(checked) >= 19
    assert all(dep == f"large@{cleaner[h]}" for h, dep in checked)  # the model the proof needs, at the cleaner site
    assert {dep.split("@")[1] for _, _, dep in joules} == {"north", "south"}  # joules: LiteLLM's spread over both
