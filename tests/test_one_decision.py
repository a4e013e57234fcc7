"""One decision rule: serving, `energy-router route`, off-policy evaluation and evaluation choose the same
candidate for the same P, Ê and knob (λ, target accuracy, energy budget, e_ref_j), on 10,000 random cases.

Each entry point is driven through its own code: serving through the strategy core (the knob resolved from
the settings and the request's metadata, then the core's decision over the pool's deployments), `route`
through the operating points it builds from the settings' knob and its flags, OPE through the choices it
scores logged rows with, evaluation through its sweep's choices. Route and OPE get a scorer that has only
the `Scorer` protocol (no `decide`, no `manifest`), as a plugin's would.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from litellm_energy_router.training.evaluate import choices as eval_choices
from litellm_energy_router.training.ope import policy_choices

from litellm_energy_router.cli.router_cmds import route_points
from litellm_energy_router.knob import Knob
from litellm_energy_router.litellm_glue.strategy import EnergyRouterCore
from litellm_energy_router.router.decide import decide
from litellm_energy_router.router.runtime import RouterRuntime, Scored
from litellm_energy_router.router.scoring import Scorer
from litellm_energy_router.settings import CandidateSettings, Settings

N_CASES = 10_000


class ArrayScorer:
    """A scorer with the protocol only: query ``"i"`` gets row ``i`` of ``P`` and ``E``."""

    name, version, inline = "arrays", "v-arrays", True

    def __init__(self, P: np.ndarray, E: np.ndarray) -> None:
        self.P, self.E = P, E
        self.candidates = [f"c{j}" for j in range(P.shape[1])]

    def score(self, texts, tasks=None):
        return self.P[[int(t) for t in texts]]

    def energy(self, texts, tasks=None, prompt_tokens=None):
        return self.E[[int(t) for t in texts]]


def _case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, dict]:
    k = int(rng.integers(2, 6))
    P = rng.uniform(size=(1, k))
    E = np.exp(rng.uniform(0, np.log(500), size=(1, k)))
    if rng.random() < 0.1:  # ties in energy and in P
        E[0, -1], P[0, -1] = E[0, 0], P[0, 0]
    knob = {
        "lambda": float(rng.choice([0.0, rng.uniform(0, 0.2), rng.uniform(0, 5)])),
        "target_accuracy": float(rng.uniform(0, 1)) if rng.random() < 0.3 else None,
        "max_energy_j": float(np.exp(rng.uniform(0, np.log(500)))) if rng.random() < 0.4 else None,
        "e_ref_j": float(rng.choice([100.0, rng.uniform(1, 500)])),
    }
    return P, E, knob


_CORES: dict[int, EnergyRouterCore] = {}


def _core(k: int) -> EnergyRouterCore:
    """The strategy core of a pool of ``k`` candidates (one per pool size; its settings' knob set per case)."""
    if k not in _CORES:
        s = Settings(candidates=[CandidateSettings(name=f"c{j}") for j in range(k)])
        _CORES[k] = EnergyRouterCore(s, runtime=RouterRuntime(None))
    return _CORES[k]


def entry_point_choices(P: np.ndarray, E: np.ndarray, k: dict) -> dict[str, int]:
    """The candidate index each entry point chooses for the one query ``P[0]``, ``E[0]`` under knob ``k``."""
    cands = [f"c{j}" for j in range(P.shape[1])]
    core = _core(len(cands))
    settings = core.settings.knob
    settings.lambda_, settings.target_accuracy, settings.max_energy_j, settings.e_ref_j = 0.0, None, None, k["e_ref_j"]
    deps = [
        {"model_name": "pool", "litellm_params": {"model": f"openai/{c}"}, "model_info": {"id": f"dep-{c}"}}
        for c in cands
    ]
    request = {
        "metadata": {
            "energy_router": {
                "lambda": k["lambda"],
                "target_accuracy": k["target_accuracy"],
                "max_energy_j": k["max_energy_j"],
            }
        }
    }
    served = core.decide(Scored(tuple(cands), P[0], E[0], "v"), deps, core.knob(request), time.perf_counter())[1]

    # route and OPE: the settings' knob (e_ref_j, the energy budget) with the λ / target asked for
    settings.max_energy_j = k["max_energy_j"]
    base = settings.base()
    scorer = ArrayScorer(P, E)
    assert isinstance(scorer, Scorer) and not hasattr(scorer, "decide") and not hasattr(scorer, "manifest")
    lams = [k["lambda"]] if k["target_accuracy"] is None else []
    ((_, _, rknob),) = route_points(base, scorer.score(["0"]), scorer.energy(["0"]), lams, None, k["target_accuracy"])
    routed = int(decide(scorer.score(["0"]), scorer.energy(["0"]), rknob)[0])

    oknob = base.model_copy(update={"lambda_": k["lambda"], "target_accuracy": k["target_accuracy"]})
    ope = policy_choices(scorer, [{"text": "0", "prompt_tokens": 10}], oknob)[0]

    evaluated = int(eval_choices(P, E, [Knob(**k)])[0, 0])
    return {"serving": cands.index(served.candidate), "route": routed, "ope": cands.index(ope), "eval": evaluated}


def test_the_issue_example_is_decided_alike():
    """P = [0.9, 0.8], Ê = [100, 20] J, λ = 0.1, e_ref_j = 50 J: 0.9 − 0.2 < 0.8 − 0.04, so candidate 1
    (the copies that always used 100 J picked candidate 0)."""
    got = entry_point_choices(
        np.array([[0.9, 0.8]]),
        np.array([[100.0, 20.0]]),
        {"lambda": 0.1, "target_accuracy": None, "max_energy_j": None, "e_ref_j": 50.0},
    )
    assert got == {"serving": 1, "route": 1, "ope": 1, "eval": 1}
    got = entry_point_choices(
        np.array([[0.9, 0.8]]),
        np.array([[100.0, 20.0]]),
        {"lambda": 0.0, "target_accuracy": None, "max_energy_j": 50.0, "e_ref_j": 100.0},
    )
    assert got == {"serving": 1, "route": 1, "ope": 1, "eval": 1}  # the budget excludes candidate 0


@pytest.mark.parametrize("seed", [0])
def test_every_entry_point_chooses_the_same_candidate(seed):
    rng = np.random.default_rng(seed)
    differ = []
    modes = {"lambda": 0, "target": 0, "budget": 0}
    for i in range(N_CASES):
        P, E, k = _case(rng)
        got = entry_point_choices(P, E, k)
        if len(set(got.values())) != 1:
            differ.append((i, got, k))
        modes["target" if k["target_accuracy"] is not None else "lambda"] += 1
        modes["budget"] += k["max_energy_j"] is not None
    assert not differ, f"{len(differ)} of {N_CASES} cases differ, first: {differ[:3]}"
    assert min(modes.values()) > N_CASES // 5  # every mode drawn often
