"""The routing strategy and the filter with a real LiteLLM Router and a real HTTP backend."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import litellm
import numpy as np
import pytest
from litellm import Router
from litellm.integrations.custom_logger import CustomLogger
from router_fixtures import CANDS, pool_deployments

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.knob import Knob, KnobError
from litellm_energy_router.litellm_glue import litellm_compat
from litellm_energy_router.litellm_glue.decision import decision_from_kwargs
from litellm_energy_router.litellm_glue.litellm_compat import cooldowns, register_strategy
from litellm_energy_router.litellm_glue.strategy import EnergyRouterCore, EnergyRouterFilter, EnergyRoutingStrategy
from litellm_energy_router.metrics import FALLBACKS
from litellm_energy_router.router.runtime import RouterRuntime
from litellm_energy_router.settings import CandidateSettings, Settings

# Real LiteLLM (Router / proxy / completion): also run at the oldest supported LiteLLM (make test-litellm-oldest).
pytestmark = pytest.mark.litellm_integration

PROOF = [{"role": "user", "content": "Give a proof about chess number 4242"}]
EASY = [{"role": "user", "content": "Tell me about rivers number 4242"}]


@pytest.fixture
def ckpt(planted_ckpt):
    return planted_ckpt


@pytest.fixture(scope="module")
def backend():
    b = LocalBackend().start()
    yield b
    b.stop()


def model_list(backend, group="pool"):
    return pool_deployments(backend, group=group)


def settings(ckpt, **router):
    return Settings.model_validate(
        {
            "router": {"checkpoint": str(ckpt), "timeout_ms": 5000, **router},
            "candidates": [{"name": c} for c in CANDS],
            "knob": {"lambda": 0.05},
        }
    )


class Recorder(CustomLogger):
    def __init__(self):
        super().__init__()
        self.decisions = []

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self.decisions.append(decision_from_kwargs(kwargs))

    def log_success_event(self, kwargs, response_obj, start_time, end_time):
        self.decisions.append(decision_from_kwargs(kwargs))


def _delta(backend, before):
    return {c: backend.count(c) - before[c] for c in CANDS}


def _snap(backend):
    return {c: backend.count(c) for c in CANDS}


def test_strategy_routes_to_different_backends(ckpt, backend):
    router = Router(model_list=model_list(backend))
    strategy = EnergyRoutingStrategy(router, settings(ckpt))
    register_strategy(router, strategy)
    rec = Recorder()
    litellm.callbacks = [rec]
    try:

        async def go():
            b = _snap(backend)
            await router.acompletion(model="pool", messages=PROOF)
            assert _delta(backend, b) == {"small": 0, "medium": 0, "large": 1}
            b = _snap(backend)
            await router.acompletion(model="pool", messages=EASY)
            assert _delta(backend, b) == {"small": 1, "medium": 0, "large": 0}
            # per-request knob: a huge lambda sends even a proof to the cheapest candidate
            b = _snap(backend)
            await router.acompletion(model="pool", messages=PROOF, metadata={"energy_router": {"lambda": 100}})
            assert _delta(backend, b) == {"small": 1, "medium": 0, "large": 0}
            # a burst of concurrent calls is scored together and routed the same way
            b = _snap(backend)
            await asyncio.gather(
                *[router.acompletion(model="pool", messages=PROOF if i % 2 else EASY) for i in range(20)]
            )
            assert _delta(backend, b) == {"small": 10, "medium": 0, "large": 10}
            await asyncio.sleep(0.5)

        asyncio.run(go())
        # sync path
        b = _snap(backend)
        router.completion(model="pool", messages=PROOF)
        assert _delta(backend, b)["large"] == 1
        # the decision travels to callbacks in the request metadata
        import time

        time.sleep(1.0)
        got = [d for d in rec.decisions if d is not None]
        assert got and got[0].candidate == "large" and got[0].router_version and 0 < got[0].propensity <= 1
        assert set(got[0].scores) == set(CANDS)
    finally:
        litellm.callbacks = []


def test_deprecated_alias_and_cooldown(ckpt, backend):
    router = Router(model_list=model_list(backend))
    strategy = EnergyRoutingStrategy(router, settings(ckpt))
    router.set_custom_routing_strategy(strategy)
    b = _snap(backend)
    asyncio.run(router.acompletion(model="pool", messages=PROOF))
    assert _delta(backend, b)["large"] == 1
    # a cooled-down deployment is not used: the router's choice among the healthy ones is
    cooldowns(router).add_deployment_to_cooldown("dep-large", 0, 429, 60)
    b = _snap(backend)
    asyncio.run(router.acompletion(model="pool", messages=PROOF))
    assert _delta(backend, b)["large"] == 0 and sum(_delta(backend, b).values()) == 1


def test_filter_callback_narrows_by_deployment_id(ckpt, backend):
    s = settings(ckpt, match_by="id")
    # map candidates to deployment ids explicitly
    s.candidates = [CandidateSettings(name=c, deployment_id=f"dep-{c}") for c in CANDS]
    filt = EnergyRouterFilter(s)
    assert filt.core.runtime.model is not None  # built outside an event loop: loaded in the constructor
    router = Router(model_list=model_list(backend))
    litellm.callbacks = [filt]
    try:
        b = _snap(backend)
        asyncio.run(router.acompletion(model="pool", messages=PROOF))
        asyncio.run(router.acompletion(model="pool", messages=EASY))
        assert _delta(backend, b) == {"small": 1, "medium": 0, "large": 1}
    finally:
        litellm.callbacks = []


def test_a_retry_the_filter_does_not_route_leaves_no_figures_for_the_response_headers(ckpt, backend):
    """The proxy's headers hook reads the figures of the request's last routed attempt: an attempt this router did
    not route (a fallback to a model group outside its pool) removes the earlier attempt's, so the headers never
    describe a deployment that did not serve the request."""
    from litellm_energy_router.litellm_glue.strategy import HEADERS_BOOK

    filt = EnergyRouterFilter(settings(ckpt))
    assert filt.core.runtime.model is not None  # built outside an event loop: loaded in the constructor
    kwargs = {"metadata": {}, "messages": EASY}
    routed = asyncio.run(filt.async_filter_deployments("pool", model_list(backend), EASY, kwargs))
    assert len(routed) == 1 and (HEADERS_BOOK.get(kwargs) is not None) == litellm_compat.sends_response_headers()
    other = [
        {**d, "litellm_params": {**d["litellm_params"], "model": "openai/elsewhere"}, "model_info": {"id": "x"}}
        for d in model_list(backend, group="other")[:1]
    ]
    assert asyncio.run(filt.async_filter_deployments("other", other, EASY, kwargs)) == other
    assert HEADERS_BOOK.get(kwargs) is None
    assert asyncio.run(filt.async_filter_deployments("pool", model_list(backend), EASY, {"messages": EASY}))  # no md


@pytest.mark.parametrize("case", ["missing_checkpoint", "timeout", "error"])
def test_fail_open(ckpt, backend, tmp_path, case):
    s = settings(ckpt, fallback="dep-medium")
    core = EnergyRouterCore(s)
    if case == "missing_checkpoint":
        core = EnergyRouterCore(settings(tmp_path / "nowhere", fallback="dep-medium"))
    elif case == "timeout":
        s.router.timeout_ms = 0.001
        slow, fast = core.runtime._model, core.runtime._model.score
        slow.score = lambda *a, **k: (__import__("time").sleep(0.2), fast(*a, **k))[1]  # a valid but late answer
    else:
        core.runtime._model.score = lambda *a, **k: 1 / 0
    reason = {"missing_checkpoint": "no_checkpoint", "timeout": "timeout", "error": "error"}[case]
    before = FALLBACKS.labels(reason=reason)._value.get()
    router = Router(model_list=model_list(backend))
    register_strategy(router, EnergyRoutingStrategy(router, core=core))
    b = _snap(backend)
    resp = asyncio.run(router.acompletion(model="pool", messages=PROOF))
    assert resp.choices[0].message.content == "answer from medium"
    assert _delta(backend, b) == {"small": 0, "medium": 1, "large": 0}
    assert FALLBACKS.labels(reason=reason)._value.get() == before + 1
    # without a configured fallback, LiteLLM's own choice serves it
    core.settings.router.fallback = None
    b = _snap(backend)
    asyncio.run(router.acompletion(model="pool", messages=PROOF))
    assert sum(_delta(backend, b).values()) == 1


def test_hot_reload_and_broken_checkpoint(ckpt, tmp_path):
    import shutil

    from litellm_energy_router.router.checkpoint import point_to

    v1, v2, bad = tmp_path / "v1", tmp_path / "v2", tmp_path / "bad"
    shutil.copytree(ckpt, v1)
    shutil.copytree(ckpt, v2)
    shutil.copytree(ckpt, bad)
    import json

    m = json.loads((v2 / "manifest.json").read_text())
    m["version"] = "v2"
    (v2 / "manifest.json").write_text(json.dumps(m))
    (bad / "student.npz").write_bytes(b"garbage")  # what the serving (student) scorer reads
    ptr = tmp_path / "current.json"
    point_to(ptr, v1)
    rt = RouterRuntime(ptr, poll_s=0.0)
    first = rt.version
    point_to(ptr, v2)
    rt.maybe_reload(block=True)
    assert rt.version == "v2" != first
    point_to(ptr, bad)
    rt.maybe_reload(block=True)
    assert rt.version == "v2" and "refused" in rt.last_error  # old one keeps serving
    assert rt.score_sync("Give a proof about x").P.shape == (3,)


def knob(lam: float, target: float | None, budget: float | None) -> Knob:
    return Knob(**{"lambda": lam}, target_accuracy=target, max_energy_j=budget)


def test_a_score_in_flight_across_a_reload_is_not_cached_for_the_new_checkpoint(tmp_path, monkeypatch):
    """A batch scored by the old checkpoint that finishes after a reload swapped the new one in: its caller gets it,
    but the cache (cleared by the reload) does not keep it, so the next request for that prompt is the new one's."""
    from litellm_energy_router.router import scoring
    from litellm_energy_router.router.checkpoint import point_to

    class Slow:
        inline, candidates, name = False, ["a", "b"], "slow"

        def __init__(self, version):
            self.version = version

        def score(self, texts, tasks):
            if self.version == "v-old" and texts != ["warm-up"]:
                time.sleep(0.3)
            return np.full((len(texts), 2), 0.5)

        def energy(self, texts, tasks):
            return np.ones((len(texts), 2))

    monkeypatch.setattr(scoring, "load_scorer", lambda path, kind="auto", expect_candidates=None: Slow(Path(path).name))
    for v in ("v-old", "v-new"):
        (tmp_path / v).mkdir()
        (tmp_path / v / "manifest.json").write_text("{}")
    ptr = tmp_path / "current.json"
    point_to(ptr, tmp_path / "v-old")

    async def go():
        r = RouterRuntime(ptr, background=False, poll_s=0.0)
        task = asyncio.create_task(r.score("hello"))  # the old checkpoint's slow pass
        await asyncio.sleep(0.1)
        point_to(ptr, tmp_path / "v-new")
        r.maybe_reload(block=True)
        old, new = await task, await r.score("hello")
        r.close()
        return old.version, new.version

    assert asyncio.run(go()) == ("v-old", "v-new")


def test_knob_precedence_request_over_key_over_default(ckpt):
    s = settings(ckpt)
    from litellm_energy_router.knob import KnobOverride

    s.knob.per_key = {"team-eco": KnobOverride(**{"lambda": 7.0}), "gold-key": KnobOverride(target_accuracy=0.95)}
    s.knob.per_key["budget-key"] = KnobOverride(max_energy_j=25.0)
    core = EnergyRouterCore(s)
    assert core.knob({}) == knob(0.05, None, None)  # global default
    assert core.knob({"metadata": {"user_api_key_team_alias": "team-eco"}}) == knob(7.0, None, None)
    assert core.knob({"litellm_metadata": {"user_api_key_alias": "gold-key"}}) == knob(0.05, 0.95, None)
    assert core.knob({"metadata": {"user_api_key_alias": "budget-key"}}) == knob(0.05, None, 25.0)
    # the request's own knob wins over its key's default
    assert core.knob({"metadata": {"user_api_key_team_alias": "team-eco", "energy_router": {"lambda": 0.2}}}) == knob(
        0.2, None, None
    )
    assert core.knob({"metadata": {"energy_router": {"target_accuracy": 0.7}}}) == knob(0.05, 0.7, None)
    assert core.knob({"metadata": {"energy_router": {"max_energy_j": 40}}}) == knob(0.05, None, 40.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 1e12, "lots", True, [1]])
@pytest.mark.parametrize("field", ["lambda", "target_accuracy", "max_energy_j"])
def test_request_knob_values_out_of_range_are_refused(ckpt, bad, field):
    """A caller error (HTTP 400 in the proxy), naming the field; null means "not given"."""
    core = EnergyRouterCore(settings(ckpt))
    with pytest.raises(KnobError) as e:
        core.knob({"metadata": {"energy_router": {field: bad}}})
    assert e.value.field == field and e.value.status_code == 400 and field in str(e.value) and "\n" not in str(e.value)
    assert core.knob({"metadata": {"energy_router": {field: None}}}) == knob(0.05, None, None)


def test_energy_budget_excludes_costlier_candidates(ckpt, backend):
    """A per-request budget below `large`'s estimated joules keeps the proof query off `large`, even at λ = 0."""
    s = settings(ckpt)
    s.knob.lambda_ = 0.0
    core = EnergyRouterCore(s)
    deps = model_list(backend)
    E = core.runtime.score_sync(PROOF[-1]["content"]).E
    cands = list(core.runtime.model.candidates)
    free, _ = asyncio.run(core.choose(deps, PROOF))
    assert core.candidate_of(free) == "large"
    budget = float((E[cands.index("large")] + E[cands.index("medium")]) / 2)
    dep, d = asyncio.run(
        core.choose(deps, PROOF, request_kwargs={"metadata": {"energy_router": {"max_energy_j": budget}}})
    )
    assert core.candidate_of(dep) != "large" and d.max_energy_j == budget
    tiny, d = asyncio.run(
        core.choose(deps, PROOF, request_kwargs={"metadata": {"energy_router": {"max_energy_j": 1e-6}}})
    )
    assert core.candidate_of(tiny) == cands[int(np.argmin(E))]  # nothing fits: the cheapest


def test_lambda_means_the_same_for_checkpoints_trained_on_different_tables(ckpt, tmp_path, sqlite_url):
    """λ's unit is the settings' (accuracy per knob.e_ref_j J), not the checkpoint's: two checkpoints trained on
    tables whose energies differ 10x decide identically for the same P, Ê and knob."""
    from litellm_energy_router.training.pipeline import TrainConfig, train
    from router_fixtures import planted_rows

    from litellm_energy_router.router.runtime import Scored
    from litellm_energy_router.table import open_store

    cands, queries, runs = planted_rows(40, seed=3, prefix="w")
    for r in runs:
        r["energy_j"] *= 10.0
    store = open_store(sqlite_url)
    store.write(queries, runs, candidates=cands)
    other = train(store, tmp_path / "other", TrainConfig.quick(), log=lambda s: None)
    s = settings(ckpt)
    cores = [EnergyRouterCore(s), EnergyRouterCore(settings(other))]
    deps = [
        {"model_name": "pool", "litellm_params": {"model": f"openai/{c}"}, "model_info": {"id": f"dep-{c}"}}
        for c in CANDS
    ]
    rng = np.random.default_rng(0)
    for _ in range(50):
        P, E = rng.uniform(size=3), rng.uniform(1, 200, size=3)
        lam = float(rng.uniform(0, 2))
        picks = {
            core.candidate_of(
                core.decide(
                    Scored(tuple(CANDS), P, E, "v"),
                    deps,
                    core.knob({"metadata": {"energy_router": {"lambda": lam}}}),
                    time.perf_counter(),
                )[0]
            )
            for core in cores
        }
        assert len(picks) == 1


def test_decision_metadata_equals_asdict_and_is_a_copy():
    from dataclasses import asdict

    from litellm_energy_router.litellm_glue.decision import Decision

    d = Decision(
        candidate="large",
        deployment_id="dep-large",
        scores={"large": 0.9},
        energy_j={"large": 90.0},
        lambda_=0.3,
        propensity=1.0,
        router_version="v1",
        latency_ms=0.4,
    )
    md = d.as_metadata()
    assert md == asdict(d) and Decision.from_metadata(md) == d
    md["scores"]["large"] = 0.0
    assert d.scores["large"] == 0.9


def test_no_decision_is_kept_for_headers_a_litellm_never_sends(ckpt, backend, monkeypatch):
    """LiteLLM 1.80.x has no response-headers hook: a decision kept for it was never read back, so every routed
    request's decision stayed in the book until evicted (counted as evictions, as if requests were lost)."""
    from litellm_energy_router.litellm_glue import litellm_compat
    from litellm_energy_router.litellm_glue.strategy import HEADERS_BOOK

    monkeypatch.setattr(litellm_compat, "sends_response_headers", lambda: False)
    filt = EnergyRouterFilter(settings(ckpt))
    assert filt.core.runtime.model is not None  # built outside an event loop: loaded in the constructor
    kwargs = {"metadata": {}, "messages": EASY}
    before = len(HEADERS_BOOK)
    assert len(asyncio.run(filt.async_filter_deployments("pool", model_list(backend), EASY, kwargs))) == 1
    assert HEADERS_BOOK.get(kwargs) is None and len(HEADERS_BOOK) <= before


def test_a_mistyped_candidate_tag_is_said_once(ckpt, backend, caplog):
    """A typo in model_info.energy_router_candidate took the deployment out of routing without a word."""
    core = EnergyRouterCore(settings(ckpt))
    core.runtime.wait_ready()
    deps = model_list(backend)
    deps[0] = {**deps[0], "model_info": {**deps[0]["model_info"], "energy_router_candidate": "smal"}}
    with caplog.at_level("WARNING", logger="litellm_energy_router"):
        for _ in range(3):
            asyncio.run(core.choose(deps, PROOF))
    core.runtime.close()
    said = [r.getMessage() for r in caplog.records if "is not a candidate of the router" in r.getMessage()]
    assert len(said) == 1 and "'smal'" in said[0] and "did you mean 'small'?" in said[0], said
