"""Routing traffic the table has never seen (router/online.py, router/context.py, router/adapt.py): production
rows correct Ê within the stated number of rows (through a real litellm.Router, the energy callback's writer
thread and a real table); an unseen context falls back to its parent; a context gets its own prior after tens of
rows (online and from table rows); far from every training query the router blends toward the prior and says so."""

from __future__ import annotations

import time

import litellm
import numpy as np
import pytest
from litellm import Router
from router_fixtures import CANDS, planted_rows, pool_deployments

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.energy.meter import RequestEnergy
from litellm_energy_router.litellm_glue.callback import EnergyLogger
from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
from litellm_energy_router.litellm_glue.strategy import EnergyRouterCore, EnergyRoutingStrategy
from litellm_energy_router.router.adapt import ADAPT, support_weight
from litellm_energy_router.router.context import (
    N0_CTX,
    Context,
    ContextPrior,
    request_context,
)
from litellm_energy_router.router.online import (
    N0,
    OnlineEnergy,
    explore_pick,
    explore_weights,
    optimal_share,
    p_sd,
)
from litellm_energy_router.settings import Settings
from litellm_energy_router.table import make_query, open_store

FAR = "写一首关于秋天的诗，并解释其中的意象。请用七言绝句。"  # nothing like the planted rows (support ≈ 0.16)
NEAR = "Tell me about rivers number 5"


@pytest.fixture(autouse=True)
def fresh_adapt():
    ADAPT.reset()
    ADAPT.enabled = True
    yield
    ADAPT.reset()


@pytest.fixture
def backend():
    with LocalBackend(delay_s=0.0) as b:
        yield b


def settings(ckpt, url, tmp_path, **router):
    return Settings.model_validate(
        {
            "router": {"checkpoint": str(ckpt), "timeout_ms": 5000, "context_refresh_s": 0, **router},
            "candidates": [{"name": c} for c in CANDS],
            "knob": {"lambda": 0.0},
            "table": {"url": url},
            "writer": {"spool_dir": str(tmp_path / "spool"), "flush_interval_s": 0.05},
        }
    )


def deps(backend, group="pool"):
    return pool_deployments(backend, group=group)


class ScaledMeter:
    """Measured joules: ``scale`` × what the checkpoint's J/token give for the tokens actually processed."""

    name, method = "scaled", "simulated"

    def __init__(self, est, scale):
        self.est, self.scale, self.seen = est, scale, []

    def request_started(self, request_id, t_s):
        pass

    def energy_for_request(self, usage, *, final=False):
        j = self.scale * (
            usage.prompt_tokens * self.est.j_per_prompt_token[usage.candidate]
            + usage.completion_tokens * self.est.j_per_output_token[usage.candidate]
        )
        self.seen.append((usage.candidate, j))
        return RequestEnergy(energy_j=j, method="simulated")

    def close(self):
        pass


def test_online_energy_closes_the_gap_by_the_stated_rule():
    """After n rows of one context Ê is within N0 / (n + N0) of its first gap to the measured joules."""
    jo, jp = np.array([0.5, 2.0]), np.array([0.01, 0.05])
    oe = OnlineEnergy(["a", "b"], jo, jp, [400, 400])
    E = 100 * jp + 200 * jo  # the checkpoint's Ê: 100 prompt tokens, 200 output tokens expected
    measured = 3.0 * (100 * jp[0] + 350 * jo[0])  # 350 tokens written, at 3x the checkpoint's J/token
    assert np.array_equal(oe.adjust(E, "ctx:x"), E)  # nothing learned yet: unchanged
    for n in range(1, 41):
        oe.update("a", 100, 350, measured, "ctx:x", estimate_j=E[0])
        gap = abs(oe.adjust(E, "ctx:x")[0] - measured) / abs(E[0] - measured)
        assert gap <= N0 / (n + N0) + 1e-9
    assert oe.adjust(E, "ctx:x")[1] == E[1]  # a candidate with no rows keeps the checkpoint's
    assert oe.adjust(E, "ctx:other")[0] > E[0]  # another context: the candidate level's correction
    u = oe.uncertainty("ctx:x")
    assert u[0] < N0 / 30 and u[1] == 1.0  # priced by 40 rows vs never priced
    tok = OnlineEnergy(["a"], [0.5], [0.01], [400])  # no meter: the rows' own tokens price them
    for _ in range(16):
        tok.update("a", 100, 20, None, "ctx:y")
    assert tok.adjust(np.array([201.0]), "ctx:y")[0] < 0.2 * 201 + 0.8 * (1 + 20 * 0.5) + 1e-9


def test_exploration_covers_uncertain_candidates_with_exact_propensities():
    import random

    q = explore_weights(np.array([0.1, 1.0, 1.0]))
    assert q.sum() == pytest.approx(1.0) and q[0] < q[1] == q[2] and q.min() > 0
    rng, eps, counts, props = random.Random(1), 0.5, np.zeros(3), {}
    for _ in range(4000):
        j, p = explore_pick(rng, eps, 0, q, 3)
        counts[j] += 1
        props[j] = p
    expected = (1 - eps) * np.array([1, 0, 0]) + eps * q
    assert np.allclose([props[j] for j in range(3)], expected)
    assert np.allclose(counts / counts.sum(), expected, atol=0.03)  # the logged propensity is what happens


def test_aimed_exploration_goes_to_the_candidates_the_context_rows_have_not_ruled_out():
    """``optimal_share``: the share of draws of P in which each candidate is the knob's choice. A candidate known
    from many rows to be worse gets none, an unexplored one whose P may well be the best gets the most; with no
    spread it is the decision itself; the weights keep the floor (exact, non-zero propensities)."""
    from litellm_energy_router.knob import Knob
    from litellm_energy_router.router.decide import decide

    knob = Knob.point(lambda_=0.2)
    P, E = np.array([0.60, 0.40, 0.55]), np.array([20.0, 10.0, 30.0])  # J
    rows = np.array([200.0, 200.0, 0.0])  # the third: no row of this context yet
    sd = p_sd(P, rows, 4.0)
    assert sd[2] == pytest.approx(np.sqrt(0.55 * 0.45 / 5.0)) and sd[0] < 0.04
    share = optimal_share(P, E, sd, lambda p, e: decide(p, e, knob))
    assert share.sum() == pytest.approx(1.0) and share[1] == 0.0 and share[2] > 0.2
    assert np.array_equal(optimal_share(P, E, np.zeros(3), lambda p, e: decide(p, e, knob)), [1.0, 0.0, 0.0])
    q = explore_weights(np.ones(3), aimed=np.where(np.arange(3) == 0, 0.0, share))  # the greedy choice left out
    assert q.min() > 0 and q[2] > q[0] == q[1] and q.sum() == pytest.approx(1.0)
    assert np.array_equal(optimal_share(P, E, sd, lambda p, e: decide(p, e, knob)), share)  # fixed draws


def test_aimed_exploration_in_serving_draws_by_its_logged_weights(planted_ckpt, sqlite_url, tmp_path, backend):
    """``router.explore: aimed`` with the context's own rows: explored requests go to the candidates the app's
    labels leave possibly best (the one it has 30 wrong answers of is not one of them), and every logged
    propensity is the exact rate of its pick."""
    import random

    core = EnergyRouterCore(
        settings(planted_ckpt, sqlite_url, tmp_path, context_rows=True, epsilon=1.0, explore="aimed")
    )
    core._rng = random.Random(3)
    dl, md = deps(backend), {"user_api_key_alias": "app-A"}
    store = open_store(sqlite_url)
    store.write(*planted_rows(40)[1:], candidates=planted_rows(40)[0])
    store.close()
    ADAPT.bind(core.runtime.model)
    ADAPT.refresh_table(sqlite_url)
    _, first = core.choose_sync(dl, [{"role": "user", "content": NEAR}], request_kwargs={"metadata": md})
    ctx = Context.parse(first.adapt["context"])
    bad = CANDS[-1]
    for _ in range(30):
        ADAPT.prior.update(ctx, bad, 0.0)
    picks = [
        core.choose_sync(dl, [{"role": "user", "content": NEAR}], request_kwargs={"metadata": md})[1]
        for _ in range(300)
    ]
    counts = {c: sum(d.candidate == c for d in picks) for c in CANDS}
    props = {d.candidate: d.propensity for d in picks}  # the same request: one rate per candidate
    assert sum(props.values()) == pytest.approx(1.0, abs=1e-5)  # ε = 1: the exploration weights themselves
    uniform = 1.0 / len(CANDS)  # the energy-only weights here: no production row prices any candidate yet
    assert props[bad] < 0.7 * uniform  # ruled out: (nearly) the energy half alone
    assert max(props.values()) > 1.3 * uniform
    for c in CANDS:
        assert counts[c] / 300 == pytest.approx(props[c], abs=0.07)  # the logged propensity is what happens


def test_a_new_context_explores_more_until_it_has_production_rows(planted_ckpt, sqlite_url, tmp_path, backend):
    """``router.epsilon_new_context``: a context without production rows explores at that rate, falling linearly
    to ``router.epsilon`` over its first NEW_CONTEXT_ROWS rows; the logged propensity is the rate used."""
    from litellm_energy_router.router.online import NEW_CONTEXT_ROWS, context_epsilon

    assert context_epsilon(0.1, 0.0, 0) == 0.1 and context_epsilon(0.1, 0.5, 0) == 0.5
    assert context_epsilon(0.1, 0.5, NEW_CONTEXT_ROWS / 2) == pytest.approx(0.3)
    assert context_epsilon(0.1, 0.5, 3 * NEW_CONTEXT_ROWS) == 0.1
    core = EnergyRouterCore(settings(planted_ckpt, sqlite_url, tmp_path, epsilon_new_context=1.0))
    dl = deps(backend)
    _, d = core.choose_sync(dl, [{"role": "user", "content": NEAR}], request_kwargs={"metadata": {}})
    assert d.adapt["context_production_rows"] == 0.0
    assert d.propensity == pytest.approx(1.0 / len(CANDS))  # ε = 1 and a uniform spread: every candidate alike
    plain = EnergyRouterCore(settings(planted_ckpt, sqlite_url, tmp_path))
    _, d0 = plain.choose_sync(dl, [{"role": "user", "content": NEAR}], request_kwargs={"metadata": {}})
    assert d0.propensity == 1.0  # ε = 0: the best candidate, always
    offline = EnergyRouterCore(settings(planted_ckpt, sqlite_url, tmp_path, epsilon_new_context=1.0, online=False))
    _, d1 = offline.choose_sync(dl, [{"role": "user", "content": NEAR}], request_kwargs={"metadata": {}})
    assert d1.adapt is None and d1.propensity == 1.0  # no online state: no context is "new", ε = router.epsilon


def test_unseen_context_falls_back_to_its_parent_and_a_context_gets_its_own_prior():
    cp = ContextPrior(["small", "large"])
    app = request_context(NEAR, [{"user_api_key_alias": "app-A"}], "pool", [{"role": "system", "content": "Be brief."}])
    other_cluster = "cl:0" if app.cluster != "cl:0" else "cl:1"
    for _ in range(50):  # the pool: large right, small wrong
        cp.update(Context("ctx:elsewhere", other_cluster), "large", 1.0)
        cp.update(Context("ctx:elsewhere", other_cluster), "small", 0.0)
    pool = cp.prior(None)
    assert np.array_equal(cp.prior(app), pool)  # unseen context and cluster: the pool's
    assert np.array_equal(cp.prior(Context("ctx:new", other_cluster)), cp.prior(Context(None, other_cluster)))
    for n in range(1, 31):  # the app's own traffic: small right, large wrong
        cp.update(app, "small", 1.0)
        cp.update(app, "large", 0.0)
    p, own, level = cp.detail(app)
    assert level == app.key and own.tolist() == [30, 30]
    parent = cp.prior(Context(None, app.cluster))
    assert abs(p[0] - 1.0) <= N0_CTX / (30 + N0_CTX) * abs(parent[0] - 1.0) + 1e-9  # 75 % its own after 30 rows
    assert p[0] > 0.9 and p[1] < 0.1 and pool[0] < 0.1


def test_context_comes_from_authenticated_fields_only():
    a = request_context("q", [{"user_api_key_alias": "app-A", "tags": ["caller-said"], "team": "x"}], "pool")
    b = request_context(
        "q", [{"user_api_key_alias": "app-A", "tags": ["other"], "requester_metadata": {"a": 1}}], "pool"
    )
    assert a == b and a.key.startswith("ctx:") and "app-A" not in str(a)
    c = request_context("q", [{"user_api_key_alias": "app-A", "user_api_key_metadata": {"tags": ["prod"]}}], "pool")
    assert c.key != a.key  # the key's own tags count
    assert request_context("q", [{"energy_router": {"lambda": 1}}], "pool").key is None  # nothing known: cluster only


def test_prior_fitted_from_tournament_and_production_rows(any_url):
    store = open_store(any_url)
    ctx = Context("ctx:00aa11bb22cc33dd", "cl:3")
    qs, runs = [], []
    for i in range(30):
        qs += [
            make_query(f"t{i}", "synthetic", f"Give a proof about birds number {i}", source="tournament"),
            make_query(f"prod-{i}", "production", f"app question {i}", source="production"),
        ]
        for c, ok in (("small", 0.0), ("large", 1.0)):
            runs.append({"query_id": f"t{i}", "candidate": c, "source": "tournament", "score": ok})
        runs.append(
            {
                "query_id": f"prod-{i}",
                "candidate": "small",
                "source": "production",
                "score": 1.0,
                "call_id": f"call-{i}",
                "status": "success",
                "context": str(ctx),
            }
        )
        # a shadow tournament ran the app's query on the other candidate: its run carries the app's context
        runs.append({"query_id": f"prod-{i}", "candidate": "large", "source": "shadow", "score": 0.0})
        runs[-1]["context"] = str(ctx) if i < 20 else None  # ten written without one: task and cluster only
    store.write(qs, runs, candidates=[{"name": c} for c in ("small", "large")])
    cp = ContextPrior(["small", "large"])
    assert cp.fit_rows(store.iter_runs()) == 120
    store.close()
    task = cp.detail(Context("task:synthetic", "cl:99"))
    assert task[2] == "task:synthetic" and task[0][1] > 0.7 and task[0][0] < 0.3
    p, own, level = cp.detail(ctx)
    assert level == ctx.key and own.tolist() == [30, 20] and p[0] > 0.9 and p[1] < 0.2
    assert cp.detail(Context("task:production", "cl:99"))[1].tolist() == [0, 10]


def test_no_support_blends_toward_the_prior_and_says_so(planted_ckpt, sqlite_url, tmp_path, backend):
    core = EnergyRouterCore(settings(planted_ckpt, sqlite_url, tmp_path))
    dl = deps(backend)
    md = {"user_api_key_alias": "app-A"}
    _, near = core.choose_sync(dl, [{"role": "user", "content": NEAR}], request_kwargs={"metadata": md})
    assert near.adapt["unsure"] is False and near.adapt["weight"] == 1.0
    raw = core.runtime.score_sync(FAR)
    _, bare = core.choose_sync(dl, [{"role": "user", "content": FAR}], request_kwargs={"metadata": md})
    w = support_weight(raw.note["support"])
    assert bare.adapt["unsure"] is True and bare.adapt["weight"] == pytest.approx(w, abs=1e-4) and w < 1
    assert bare.adapt["prior_level"] == "none"  # an empty table: no prior yet, the scorer's P stands
    assert [bare.scores[c] for c in CANDS] == pytest.approx(raw.P, abs=1e-5)
    store = open_store(sqlite_url)
    store.write(*planted_rows(40)[1:], candidates=planted_rows(40)[0])  # tournament rows: large right on every query
    store.close()
    assert ADAPT.refresh_table(sqlite_url) == 120
    _, far = core.choose_sync(dl, [{"role": "user", "content": FAR}], request_kwargs={"metadata": md})
    assert far.adapt["prior_level"] == "pool"
    pool = ADAPT.prior.prior(None)
    assert [far.scores[c] for c in CANDS] == pytest.approx(w * raw.P + (1 - w) * pool, abs=1e-5)
    assert far.candidate == "large"
    ctx = Context.parse(far.adapt["context"])
    for _ in range(30):  # this app's labelled rows: small is right for it, large is not
        ADAPT.prior.update(ctx, "small", 1.0)
        ADAPT.prior.update(ctx, "medium", 0.0)
        ADAPT.prior.update(ctx, "large", 0.0)
    _, again = core.choose_sync(dl, [{"role": "user", "content": FAR}], request_kwargs={"metadata": md})
    assert again.adapt["prior_level"] == "ctx" and again.candidate == "small"
    _, other = core.choose_sync(
        dl, [{"role": "user", "content": FAR}], request_kwargs={"metadata": {"user_api_key_alias": "app-B"}}
    )
    assert other.adapt["prior_level"] == "cl" and other.candidate == "small"  # app-B: the cluster's, app-A's rows in it


@pytest.mark.litellm_integration
@pytest.mark.usefixtures("fresh_litellm_callbacks")
def test_production_rows_correct_the_estimate_through_the_callback(planted_ckpt, sqlite_url, tmp_path, backend):
    """Real Router + strategy + EnergyLogger: each settled row (measured 4x the checkpoint's J/token) reaches the
    serving router's online state off the event loop; after n rows its Ê is within N0/(n+N0) of the gap."""
    s = settings(planted_ckpt, sqlite_url, tmp_path)
    core = EnergyRouterCore(s)
    est = core.runtime.model.manifest.energy
    meter = ScaledMeter(est, 4.0)
    logger = EnergyLogger(s, meter=meter)
    litellm.callbacks = [logger]
    router = Router(model_list=deps(backend))
    register_strategy(router, EnergyRoutingStrategy(router, core=core))
    md = {"user_api_key_alias": "app-A"}
    msgs = [{"role": "user", "content": FAR}]
    try:
        first = core.choose_sync(deps(backend), msgs, request_kwargs={"metadata": dict(md)})[1]
        n = 16
        for i in range(n):
            router.completion(model="pool", messages=msgs, metadata=dict(md))
        deadline = time.monotonic() + 60
        while logger.writer.submitted < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert logger.flush(30)
        served = {c for c, _ in meter.seen}
        assert served == {first.candidate} and ADAPT.energy.rows == n
        measured = meter.seen[-1][1]
        last = core.choose_sync(deps(backend), msgs, request_kwargs={"metadata": dict(md)})[1]
        c = first.candidate
        assert abs(last.energy_j[c] - measured) <= N0 / (n + N0) * abs(first.energy_j[c] - measured) + 0.01
        store = open_store(sqlite_url)
        rows = list(store.iter_runs())
        store.close()
        assert len(rows) == n and {r["context"] for r in rows} == {first.adapt["context"]}
    finally:
        logger.close()


def test_a_context_s_own_labels_move_p_for_supported_requests_by_the_stated_rule(
    planted_ckpt, sqlite_url, tmp_path, backend
):
    core = EnergyRouterCore(settings(planted_ckpt, sqlite_url, tmp_path, context_rows=True))
    dl = deps(backend)
    store = open_store(sqlite_url)
    store.write(*planted_rows(40)[1:], candidates=planted_rows(40)[0])
    store.close()
    ADAPT.bind(core.runtime.model)
    ADAPT.refresh_table(sqlite_url)
    raw = core.runtime.score_sync(NEAR)
    md = {"user_api_key_alias": "app-A"}
    _, first = core.choose_sync(dl, [{"role": "user", "content": NEAR}], request_kwargs={"metadata": md})
    assert first.adapt["weight"] == 1.0 and "context_rows" not in first.adapt
    assert [first.scores[c] for c in CANDS] == pytest.approx(raw.P, abs=1e-5)  # no own rows yet: the scorer's P
    ctx = Context.parse(first.adapt["context"])
    for _ in range(12):  # app-A's labels: "small" is always right for it
        ADAPT.prior.update(ctx, "small", 1.0)
    _, later = core.choose_sync(dl, [{"role": "user", "content": NEAR}], request_kwargs={"metadata": md})
    n0, k = ADAPT.prior.n0, CANDS.index("small")
    shift = 12.0 * (1.0 - raw.P[k]) / (12.0 + n0)  # the app's mean residual, shrunk: every candidate moves by it
    want = np.clip(raw.P + shift, 0.0, 1.0)
    want[k] = (12.0 + n0 * want[k]) / (12.0 + n0)
    assert later.adapt["context_rows"] == 12 and later.adapt["weight"] == 1.0
    assert [later.scores[c] for c in CANDS] == pytest.approx(want, abs=1e-5)
    _, other = core.choose_sync(
        dl, [{"role": "user", "content": NEAR}], request_kwargs={"metadata": {"user_api_key_alias": "app-B"}}
    )
    assert [other.scores[c] for c in CANDS] == pytest.approx(raw.P, abs=1e-5)  # another app: not moved
    plain = EnergyRouterCore(settings(planted_ckpt, sqlite_url, tmp_path))  # router.context_rows off (the default)
    _, off = plain.choose_sync(dl, [{"role": "user", "content": NEAR}], request_kwargs={"metadata": md})
    assert [off.scores[c] for c in CANDS] == pytest.approx(raw.P, abs=1e-5) and "context_rows" not in off.adapt


def test_the_context_refresher_ends_when_its_runtime_closes(planted_ckpt, sqlite_url, tmp_path):
    """One refresher thread per serving core, reading the table every ``context_refresh_s``; a closed core's
    thread ends within that period instead of refreshing the process-wide adaptation with a stale model."""
    import threading

    def refreshers() -> set:
        return {t for t in threading.enumerate() if t.name == "energy-router-context"}

    before = refreshers()
    open_store(sqlite_url).close()
    core = EnergyRouterCore(settings(planted_ckpt, sqlite_url, tmp_path, context_refresh_s=0.05))
    core.runtime.wait_ready()
    mine = refreshers() - before
    assert len(mine) == 1
    core.runtime.close()
    (t,) = mine
    t.join(5)
    assert not t.is_alive()


def test_a_harder_app_moves_every_candidate_not_only_the_labelled_one():
    """Labels of an app on the served candidate alone: the app's shortfall against the scorer lowers the candidates
    it has no rows of too, so an unexplored one does not win merely for having none (it did before the shift)."""
    from litellm_energy_router.router.context import ContextPrior

    cp = ContextPrior(["big", "small"], n0=10.0)
    parent = np.array([0.8, 0.7])
    for _ in range(30):
        cp.update("ctx:a", "big", 0.5)
    P, n = cp.on_top(parent, "ctx:a")
    assert n.tolist() == [30.0, 0.0]
    shift = 30 * (0.5 - 0.8) / 40
    assert P == pytest.approx([(15.0 + 10.0 * (0.8 + shift)) / 40.0, 0.7 + shift])
    assert P[0] > P[1]


class _Est:
    """A checkpoint's energy estimate as ``Adaptation.bind`` reads it (J/token, chat-length prior)."""

    def __init__(self, cands):
        self.cands = cands

    def unknown_task_tokens(self):
        return {c: 100.0 for c in self.cands}

    def rates(self, cands):
        return [0.01] * len(cands), [0.1] * len(cands)


def _model(version, cands=("small", "large")):
    from types import SimpleNamespace

    return SimpleNamespace(
        version=version, candidates=list(cands), manifest=SimpleNamespace(energy=_Est(cands), context_n0=None)
    )


def test_rows_decided_by_a_replaced_checkpoint_do_not_correct_the_new_one():
    """A row in flight across a hot reload carries the old checkpoint's estimate: it teaches the new state nothing
    (v1 under-priced 'small' 2x; v2 does not, and must not be corrected twice). A row without a version (a fallback)
    is compared with the served checkpoint's own estimate, not with the one it carries."""
    from litellm_energy_router.router.adapt import Adaptation

    a = Adaptation()
    a.bind(_model("v1"))
    a.bind(_model("v2"))
    ctx = str(Context("ctx:a", "cl:1"))
    for _ in range(20):
        a.observe("small", 10, 100, 20.0, ctx, 10.0, "v1")  # measured 2x v1's estimate
    assert a.energy.rows == 0
    a.observe("small", 10, 100, 10.1, ctx, 10.1, "v2")
    a.observe("small", 10, 100, 10.1, ctx, 1.0, None)  # its 1 J estimate is ignored: 10.1 J is v2's own
    q, _ = a.energy.ratios("ctx:a")
    assert a.energy.rows == 2 and abs(q[0] - 1.0) < 0.01


def test_a_refresh_across_a_new_prior_reads_every_row_into_the_new_one_and_two_refreshes_never_overlap():
    """``bind`` to a checkpoint with other candidates replaces the prior while a refresh streams rows into the old
    one: the last id read stays where the new prior starts (-1), so the next refresh gives it every row; a second
    refresh while one runs (another core of the process) reads nothing rather than counting rows twice."""
    from litellm_energy_router.router.adapt import Adaptation

    a = Adaptation()
    a.bind(_model("v1"))
    rows = [
        {"id": i, "source": "tournament", "task": "t", "text": f"q {i}", "candidate": "small", "score": 1.0}
        for i in range(1, 41)
    ]
    inner = []

    def stream():
        for r in rows:
            if r["id"] == 20:
                inner.append(a.refresh_from(iter(rows), wait_s=0))  # a concurrent refresh: waits, here not at all
                a.bind(_model("v2", ("small", "mid", "large")))
            yield r

    a.refresh_from(stream())
    assert inner == [0] and a.last_run_id == -1 and a.prior.rows == 0
    assert a.refresh_from(iter(rows)) == 40 and a.last_run_id == 40
    assert a.refresh_from(iter(rows)) == 0


def test_a_refresh_that_cannot_open_the_table_leaves_the_next_one_free(tmp_path):
    """The table is missing (or down) for one refresh: the error is the caller's to log, and the next refresh
    (another core's, or the same thread's next turn) still runs."""
    from litellm_energy_router.router.adapt import Adaptation

    a = Adaptation()
    a.bind(_model("v1"))
    with pytest.raises(Exception):
        a.refresh_table(f"sqlite:///{tmp_path / 'missing' / 'none.db'}")
    assert a.refresh_from(iter([]), wait_s=0.5) == 0 and a._refreshing.acquire(blocking=False)
    a._refreshing.release()


def test_one_row_cannot_steer_a_candidate_s_energy_ratio():
    """A row's measured / estimated ratio counts within 16x of what its level learned: after 500 rows at the
    estimate, one request of 30,000 output tokens (900x its estimate) moves the shared candidate ratio by a few
    percent at most, while a steady 3x corrects fully and traffic priced 100x too low is learned in tens of rows."""
    from litellm_energy_router.router.online import ROW_RATIO_MAX

    oe = OnlineEnergy(["a"], [0.5], [0.01], [30])
    for _ in range(500):
        oe.update("a", 100, 30, 16.0, "ctx:honest", estimate_j=16.0)
    oe.update("a", 100, 30_000, None, "ctx:hostile", estimate_j=16.0)  # token-based: 15,001 J
    q, _ = oe.ratios("ctx:honest")
    assert 1.0 < q[0] < 1.0 + ROW_RATIO_MAX / 500 + 0.01
    steady = OnlineEnergy(["a"], [0.5], [0.01], [30])
    for _ in range(60):
        steady.update("a", 100, 30, 48.0, "ctx:x", estimate_j=16.0)
    assert steady.ratios("ctx:x")[0][0] == pytest.approx(3.0, rel=0.02)
    far = OnlineEnergy(["a"], [0.5], [0.01], [30])  # a new kind of traffic priced 100x too low (issue 22)
    for _ in range(30):
        far.update("a", 100, 30, 1600.0, "ctx:new", estimate_j=16.0)
    assert far.ratios("ctx:new")[0][0] > 80.0  # learned within tens of rows: the bound follows the level


def test_one_key_cannot_mint_contexts_without_bound_through_its_system_prompts():
    """The system prompt is the caller's to write: one authenticated key gets a context of its own for its first
    MAX_SYSTEM_PROMPTS system prompts, every later one shares one; another key keeps its own contexts."""
    from litellm_energy_router.router.context import MAX_SYSTEM_PROMPTS

    md = [{"user_api_key_alias": "flood"}]
    keys = {
        request_context(
            "q", md, "pool", [{"role": "system", "content": f"prompt {i}"}, {"role": "user", "content": "q"}]
        ).key
        for i in range(MAX_SYSTEM_PROMPTS + 200)
    }
    assert len(keys) == MAX_SYSTEM_PROMPTS + 1
    sys0 = [{"role": "system", "content": "prompt 0"}, {"role": "user", "content": "q"}]
    assert request_context("q", md, "pool", sys0).key in keys  # an admitted prompt keeps its context
    other = [{"user_api_key_alias": "quiet"}]
    assert request_context("q", other, "pool", sys0).key not in keys


def test_a_decision_dropped_before_its_callback_is_counted():
    """More requests in flight than the decision book holds: the oldest decisions drop (their rows lose the
    propensity, context and estimate) and each drop is counted in energy_router_decisions_evicted_total."""
    from litellm_energy_router.litellm_glue.decision import Decision, DecisionBook
    from litellm_energy_router.metrics import DECISIONS_EVICTED

    book = DecisionBook(maxsize=3, name="test")
    before = DECISIONS_EVICTED.labels(book="test")._value.get()
    mds = [{} for _ in range(5)]
    for md in mds:
        book.put(md, Decision(candidate="a"))
    assert DECISIONS_EVICTED.labels(book="test")._value.get() - before == 2
    assert book.get({"metadata": mds[0]}) is None and book.get({"metadata": mds[4]}) is not None


def test_the_decision_book_does_not_keep_a_requests_metadata_alive():
    """A decision no callback reads back (the filter without the energy callback; the headers hook LiteLLM 1.80 lacks)
    held the request's whole metadata dict, whose size the caller chooses: 1,000 requests of 1 MiB kept 1 GiB. The book
    keeps a token it wrote into the dict, and a dict under a reused id without that token finds nothing."""
    import gc
    import weakref

    from litellm_energy_router.litellm_glue.decision import Decision, DecisionBook

    class Md(dict):  # a dict that can be weakly referenced
        pass

    book = DecisionBook(maxsize=10, name="test-alive")
    md = Md(payload="x" * 1_000_000)
    book.put(md, Decision(candidate="a"))
    assert book.get({"metadata": md}).candidate == "a"
    alive = weakref.ref(md)
    del md
    gc.collect()
    assert alive() is None and len(book) == 1
    other = {"payload": "y"}
    book.put(other, Decision(candidate="b"))
    forged = dict(other)  # another dict (another id) carrying the same token: not its entry
    assert book.get({"metadata": forged}) is None
    other.pop("_energy_router_test-alive")  # the same id without the token (a reused id): not its entry
    assert book.get({"metadata": other}) is None


def test_exploration_stays_inside_the_energy_budget_and_off_over_a_hard_cap(
    planted_ckpt, sqlite_url, tmp_path, backend
):
    """ε explores only among the candidates within the request's ``max_energy_j`` (it sent ~ε of capped requests to a
    candidate over the cap, up to 4.5x it), with exact propensities over those; a tenant over a hard budget whose
    action is ``cheapest`` is not explored at all."""
    from litellm_energy_router.budgets import CHEAPEST_LAMBDA
    from litellm_energy_router.knob import Knob

    core = EnergyRouterCore(settings(planted_ckpt, sqlite_url, tmp_path, epsilon=0.5))
    dl, msgs = deps(backend), [{"role": "user", "content": NEAR}]
    _, d0 = core.choose_sync(dl, msgs, request_kwargs={"metadata": {}})
    cheap = sorted(d0.energy_j.values())
    cap = (cheap[1] + cheap[2]) / 2  # two candidates fit
    seen = set()
    for _ in range(200):
        kw = {"metadata": {"energy_router": {"max_energy_j": cap}}}
        _, d = core.choose_sync(dl, msgs, request_kwargs=kw)
        assert d.energy_j[d.candidate] <= cap
        seen.add(d.candidate)
        assert d.propensity in (pytest.approx(0.75), pytest.approx(0.25))  # 1 - ε + ε/2 or ε/2: two explorable
    assert len(seen) == 2
    over = Knob().model_copy(update={"lambda_": CHEAPEST_LAMBDA})  # what BudgetBook.apply gives over the cap
    picks = {core.decide(core.runtime.score_sync(NEAR), dl, over, 0.0)[1].candidate for _ in range(100)}
    assert len(picks) == 1


def test_the_context_prior_counts_one_row_per_query_and_candidate():
    """Training keeps one row per (query, candidate), a shadow row over the production one; the context prior counted
    both, so a labelled production query a shadow tournament also ran gave the served candidate two rows (and mixed
    the user's label with the judge's). Whichever arrives first, one row counts, the unbiased one."""
    from litellm_energy_router.router.context import ContextPrior

    A, B, ctx = "a", "b", "ctx:0123456789abcdef|cl:3"
    prod = {"query_id": "prod-1", "candidate": A, "source": "production", "score": 1.0, "context": ctx}
    shadow = [
        {"query_id": "prod-1", "candidate": c, "source": "shadow", "score": s, "context": ctx}
        for c, s in ((A, 0.0), (B, 1.0))
    ]
    for rows in ([prod, *shadow], [*shadow, prod]):
        prior = ContextPrior([A, B])
        prior.fit_rows(rows)
        p, n, level = prior.detail(ctx)
        assert level == "ctx:0123456789abcdef" and n.tolist() == [1.0, 1.0], (rows[0]["source"], n)
        assert prior.rows == 2.0 and p[0] < p[1]  # A's row is the shadow's 0.0, not the user's 1.0
    prior = ContextPrior([A, B])  # another query's rows still add up
    prior.fit_rows([prod, {**prod, "query_id": "prod-2"}])
    assert prior.rows == 2.0
