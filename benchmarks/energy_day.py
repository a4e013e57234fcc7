"""A day of traffic under energy budgets and the carbon objective (issue 24, items 4-5).

    python benchmarks/energy_day.py [--quick] [--requests N] [--workdir DIR] [--budget-fraction 0.75]

* **Router.** A ``logreg`` scorer (per-candidate logistic regression on MiniLM embeddings, a registered
  baseline kind) fitted on half of the bundled RouterBench development queries (split by a stable hash,
  salt ``energy-day``); the day's prompts are drawn from the other half. Served without a task tag.
* **Traffic.** ``--requests`` (20,000; ``--quick`` 3,000) arrivals over one simulated UTC day, hourly rate
  ∝ 1 + 0.8 sin(2π(h − 8)/24) (peak 14:00, trough 02:00), from three keys in two teams: ``app-a1`` (35 %)
  and ``app-a2`` (25 %) in ``team-a``, ``app-b1`` (40 %) in ``team-b``. Each request goes through a real
  ``litellm.Router`` with :class:`EnergyRoutingStrategy` and :class:`EnergyLogger` (``estimate`` meter: the
  bundled ML.ENERGY H100 profile x the replayed answers' tokens; energy is estimated, not measured), to the
  one local backend replaying RouterBench's recorded answers; 32 in flight. Accuracy = RouterBench's
  recorded correctness of the served candidate.
* **Sites.** Every candidate is deployed in two sites, ``north`` (PUE 1.1) and ``south`` (PUE 1.3), with
  an hourly intensity CSV (north: solar, clean at midday; south: flatter, cleaner at night).
* **Simulated clock.** The day's time is the arrival time of the request dispatched last; the budgets'
  clock reads it, and the carbon intensity of any real time (a decision, a settled row) is looked up at the
  simulated time of that moment (:class:`SimIntensity`, an intensity provider). The ledger's ``day`` is the
  real UTC day, which the simulated day is set to.
* **Runs.** (1) *unconstrained*: global λ, objective joules, no budget. (2) *budgeted*: ``team-a`` gets a
  soft daily joules budget of ``--budget-fraction`` x its run-1 spend (pace shaped by the arrival curve,
  the default η); ``app-b1`` gets ``objective: carbon`` with λ chosen *before* the run so that its mean
  predicted accuracy on the day's requests equals run 1's (a bisection over the router's own P and Ê, no
  labels). Same arrivals and prompts in both runs.

The last line: ``budget_error_pct`` = |team-a spend − budget| / budget x 100 (run 2, ledger);
``acc_cost`` = team-a accuracy, run 1 − run 2, in points; ``co2e_saved_pct`` = app-b1's gCO2e (ledger),
run 1 → run 2, in % (its accuracy change, with a bootstrap 95 % interval, is printed above it);
``ledger_mismatch`` = served requests whose joules are not exactly once in the ledger, both runs.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import hashlib
import logging
import math
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

KEYS = {"app-a1": ("team-a", 0.35), "app-a2": ("team-a", 0.25), "app-b1": ("team-b", 0.40)}
SITES = {"north": ("N", 1.1), "south": ("S", 1.3)}
GROUP = "day-pool"
LAMBDA = 0.05  # the global knob: accuracy per 100 J
CONCURRENCY = 32


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()  # the key's hash, as LiteLLM's user_api_key_hash


def hourly_traffic() -> list[float]:
    return [1 + 0.8 * math.sin(2 * math.pi * (h - 8) / 24) for h in range(24)]


def intensity_csv(path: Path) -> Path:
    """gCO2e/kWh per UTC hour: north solar (420 at night, 120 at noon), south flatter (260-380, low at night)."""
    rows = ["region,hour,g_co2e_per_kwh"]
    for h in range(24):
        sun = max(0.0, math.sin(math.pi * (h - 6) / 12))
        rows += [f"N,{h},{420 - 300 * sun:.1f}", f"S,{h},{320 + 60 * math.sin(2 * math.pi * (h - 9) / 24):.1f}"]
    path.write_text("\n".join(rows) + "\n")
    return path


class SimClock:
    """Simulated time: the arrival time of the request dispatched last; :meth:`at` maps a real time to it."""

    def __init__(self, start_s: float) -> None:
        self.real, self.sim = [time.time()], [start_s]

    def advance(self, sim_s: float) -> None:
        self.real.append(time.time())
        self.sim.append(sim_s)

    def now(self) -> float:
        return self.sim[-1]

    def at(self, real_s: float) -> float:
        return self.sim[max(0, bisect.bisect_right(self.real, real_s) - 1)]


class SimIntensity:
    """Intensity provider: the CSV's value at the simulated time of a real time."""

    def __init__(self, table: Any, clock: SimClock) -> None:
        self.table, self.clock = table, clock

    def intensity(self, region: str, t_s: float) -> float | None:
        return self.table.lookup(region, self.clock.at(t_s))


@dataclass
class Req:
    t: float  # simulated arrival, Unix s
    key: str
    prompt: int  # index into the served records


def make_day(n: int, n_prompts: int, day_start: float, seed: int) -> list[Req]:
    rng = random.Random(seed)
    w = hourly_traffic()
    keys, shares = list(KEYS), [s for _, s in KEYS.values()]
    hours = rng.choices(range(24), weights=w, k=n)
    out = [
        Req(day_start + h * 3600 + rng.random() * 3600, rng.choices(keys, shares)[0], rng.randrange(n_prompts))
        for h in hours
    ]
    return sorted(out, key=lambda r: r.t)


# -- setup ----------------------------------------------------------------------------------------------


def prepare(workdir: Path) -> tuple[list[Any], Path, list[str]]:
    """(records served in the day, a logreg checkpoint fitted on the other half, candidates)."""
    from litellm_energy_router.energy.profile import load_profile
    from litellm_energy_router.profiling.routerbench import bundled_files, import_routerbench, iter_records
    from litellm_energy_router.table import open_store
    from litellm_energy_router.training.baselines import export_baseline
    from litellm_energy_router.training.data import holdout_split, load_matrix

    recs = list(iter_records(bundled_files()))
    ids = sorted(r.query_id for r in recs)
    tr, te = holdout_split(ids, 0.5, salt="energy-day")
    train_ids, serve_ids = {ids[i] for i in tr}, {ids[i] for i in te}
    ckpt = workdir / "router"
    store = open_store(f"sqlite:///{workdir / 'train.db'}")
    try:
        if not (ckpt / "manifest.json").exists():
            import_routerbench(store, bundled_files(), load_profile(), keep=lambda q: q in train_ids)
            log(f"fitting the logreg router on {len(train_ids)} queries")
            export_baseline("logreg", load_matrix(store), ckpt)
        cands = [c.name for c in store.candidates()]
    finally:
        store.close()
    return [r for r in recs if r.query_id in serve_ids], ckpt, cands


def settings(workdir: Path, name: str, ckpt: Path, csv: Path, cands: list[str], extra: dict[str, Any]) -> Any:
    from litellm_energy_router.settings import Settings

    db = workdir / f"{name}.db"
    db.unlink(missing_ok=True)
    return Settings.model_validate({
        "table": {"url": f"sqlite:///{db}"},
        "router": {"checkpoint": str(ckpt), "timeout_ms": 10000, "cache_size": 8192},
        "candidates": [{"name": c} for c in cands], "knob": {"lambda": LAMBDA, **extra.get("knob", {})},
        "energy": {"meter": "estimate"},
        "writer": {"spool_dir": str(workdir / f"spool-{name}"), "flush_interval_s": 0.2},
        "carbon": {"intensity_csv": str(csv), "sites": {s: {"region": r, "pue": p} for s, (r, p) in SITES.items()}},
        "budgets": extra.get("budgets", {}),
    })  # fmt: skip


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


# -- one day through LiteLLM ----------------------------------------------------------------------------


@dataclass
class Served:
    call_id: str
    deployment: str
    candidate: str
    site: str


async def _replay(day: list[Req], prompts: list[str], api_base: str, s: Any, rt: Any, clock: SimClock,
                  table: Any) -> list[Served]:  # fmt: skip
    import litellm

    from litellm_energy_router.budgets import BudgetBook
    from litellm_energy_router.callback import EnergyLogger
    from litellm_energy_router.callback.accounting import RowAccounting
    from litellm_energy_router.demo.backend import deployment
    from litellm_energy_router.energy.carbon import CarbonModel
    from litellm_energy_router.figures import Accounting
    from litellm_energy_router.litellm_compat import register_strategy
    from litellm_energy_router.strategy import EnergyRouterCore, EnergyRoutingStrategy

    provider = SimIntensity(table, clock)
    logger = EnergyLogger(s, accounting=RowAccounting(CarbonModel(s.carbon, provider=provider)))
    litellm.logging_callback_manager._reset_all_callbacks()  # LiteLLM keeps one instance per callback class
    litellm.callbacks = [logger]
    deps = []
    for c in s.candidates:
        for site in SITES:
            d = deployment(api_base, c.name, group=GROUP, id=f"{c.name}@{site}", candidate=True)
            deps.append({**d, "model_info": {**d["model_info"], "energy_router_site": site}})
    router = litellm.Router(model_list=deps, num_retries=0)
    b = s.budgets
    book = BudgetBook(b, s.table.url, clock=clock.now).start() if b.keys or b.teams else None
    core = EnergyRouterCore(s, runtime=rt, budgets=book)
    core.accounting = Accounting(s, carbon=CarbonModel(s.carbon, provider=provider))
    register_strategy(router, EnergyRoutingStrategy(router, core=core))
    sem, served = asyncio.Semaphore(CONCURRENCY), [None] * len(day)

    async def one(i: int, r: Req) -> None:
        team = KEYS[r.key][0]
        md = {"user_api_key_alias": r.key, "user_api_key_team_id": team,
              "user_api_key_hash": _hash(r.key)}  # fmt: skip
        try:
            resp = await router.acompletion(
                model=GROUP, messages=[{"role": "user", "content": prompts[r.prompt]}], metadata=md
            )
            dep = str(resp._hidden_params.get("model_id"))
            served[i] = Served(str(resp._hidden_params["litellm_call_id"]), dep, *dep.split("@"))
        finally:
            sem.release()

    tasks, t0, last = [], time.time(), 0.0
    for i, r in enumerate(day):
        await sem.acquire()
        clock.advance(r.t)
        tasks.append(asyncio.create_task(one(i, r)))
        if time.time() - last > 5:
            last = time.time()
            log(
                f"  {i}/{len(day)} sent, simulated {time.strftime('%H:%M', time.gmtime(r.t))} UTC, "
                f"{i / (last - t0):.0f} req/s"
                + (" " + _budget_line(core) if core.budgets else "")
            )
    await asyncio.gather(*tasks)
    while logger.writer.submitted < len(day):
        await asyncio.sleep(0.05)
    if core.budgets is not None:
        core.budgets.close()
    await asyncio.to_thread(logger.flush, 120)
    logger.close()
    return served  # type: ignore[return-value]


def _budget_line(core: Any) -> str:
    from litellm_energy_router.budgets import elapsed_share

    out = []
    for st in core.budgets.states:
        pace = st.cfg.limit * elapsed_share(core.budgets.clock(), st.cfg.period, st.cfg.pace)
        out.append(f"{st.where}: spent {st.spent / 1e3:.1f} kJ / pace {pace / 1e3:.1f} kJ, μ={st.mu:.3f}")
    return "; ".join(out)


def warm(rt: Any, prompts: set[str]) -> None:
    """The scorer's cache (``router.cache_size``) filled with the day's distinct prompts, micro-batched: the
    decisions are those of a cold cache; the replays just do not wait for ~1,100 single embeddings."""

    async def go() -> None:
        await asyncio.gather(*(rt.score(p) for p in prompts))

    asyncio.run(go())


def replay(day: list[Req], records: list[Any], s: Any, rt: Any, day_start: float, csv: Path) -> list[Served]:
    import litellm

    from litellm_energy_router.demo.backend import LocalBackend, ReplayAnswers
    from litellm_energy_router.energy.carbon import load_intensity_csv

    litellm.suppress_debug_info = True
    for name in ("LiteLLM", "LiteLLM Router", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with LocalBackend(ReplayAnswers(records)) as backend:
        return asyncio.run(_replay(day, [r.prompt for r in records], backend.base_url, s, rt, SimClock(day_start),
                                   load_intensity_csv(csv)))  # fmt: skip


# -- calibration: app-b1's carbon λ at the joules run's predicted accuracy (no labels) ----------------------


def carbon_lambda(day: list[Req], prompts: list[str], rt: Any, s: Any) -> tuple[float, float]:
    """(λ of the carbon objective, the predicted accuracy both match) for app-b1's requests."""
    from litellm_energy_router.energy.carbon import CarbonModel
    from litellm_energy_router.knob import Knob
    from litellm_energy_router.router.decide import decide

    reqs = [r for r in day if r.key == "app-b1"]
    cache: dict[int, Any] = {}
    for r in reqs:
        if r.prompt not in cache:
            cache[r.prompt] = rt.score_sync(prompts[r.prompt])
    P = np.stack([cache[r.prompt].P for r in reqs])
    E = np.stack([cache[r.prompt].E for r in reqs])
    cm = CarbonModel(s.carbon)  # every candidate is in both sites: its factor is the cleaner site's at that hour
    F = np.array([min(cm.factor(site, r.t) for site in SITES) for r in reqs])[:, None] * np.ones_like(E)
    rows = np.arange(len(reqs))
    target = float(P[rows, decide(P, E, Knob.point(lambda_=LAMBDA))].mean())
    lo, hi = 0.0, 50 * LAMBDA
    for _ in range(40):
        mid = (lo + hi) / 2
        acc = float(P[rows, decide(P, E, Knob.point(lambda_=mid, objective="carbon"), F)].mean())
        lo, hi = (mid, hi) if acc > target else (lo, mid)
    return (lo + hi) / 2, target


def hindsight(day: list[Req], served: list[Served], records: list[Any], rt: Any) -> tuple[float, np.ndarray]:
    """(the constant λ that, chosen with hindsight, spends on team-a's requests the router's estimated joules
    of the budgeted run's choices; the recorded correctness of its choices): what the multiplier should match."""
    from litellm_energy_router.demo.backend import ReplayAnswers
    from litellm_energy_router.knob import Knob
    from litellm_energy_router.router.decide import decide

    idx = [i for i, r in enumerate(day) if KEYS[r.key][0] == "team-a"]
    sc = {p: rt.score_sync(records[p].prompt) for p in {day[i].prompt for i in idx}}
    P = np.stack([sc[day[i].prompt].P for i in idx])
    E = np.stack([sc[day[i].prompt].E for i in idx])
    cands = list(sc[day[idx[0]].prompt].candidates)
    rows = np.arange(len(idx))
    spent = float(E[rows, [cands.index(served[i].candidate) for i in idx]].sum())
    lo, hi = 0.0, 1000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if E[rows, decide(P, E, Knob.point(lambda_=mid))].sum() > spent else (lo, mid)
    choice = decide(P, E, Knob.point(lambda_=hi))
    answers = ReplayAnswers(records)
    return hi, np.array([answers.grade(records[day[i].prompt].prompt, cands[j]) or 0.0 for i, j in zip(idx, choice)])


# -- outcome ------------------------------------------------------------------------------------------------


def outcome(day: list[Req], served: list[Served], records: list[Any], url: str) -> dict[str, Any]:
    """Per request: accuracy, joules and gCO2e (its table row); the ledger check; spend per key/team (ledger)."""
    from litellm_energy_router.demo.backend import ReplayAnswers
    from litellm_energy_router.table import ledger, open_store

    answers = ReplayAnswers(records)
    store = open_store(url, create=False)
    try:
        rows = {r["call_id"]: r for r in store.iter_runs() if r["source"] == "production"}
        with store.engine.connect() as conn:
            led = ledger.report(conn, "deployment", extra="key")
    finally:
        store.close()
    acc = np.array([answers.grade(records[r.prompt].prompt, sv.candidate) or 0.0 for r, sv in zip(day, served)])
    joules = np.array([(rows.get(sv.call_id) or {}).get("energy_j") or 0.0 for sv in served])
    co2e = np.array([(rows.get(sv.call_id) or {}).get("co2e_g") or 0.0 for sv in served])
    # ledger check: per (deployment, key) group, the ledger's requests and joules against the served calls' rows
    want: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, (r, sv) in enumerate(zip(day, served)):
        want[(sv.deployment, _hash(r.key))].append(i)
    got = {(x["deployment"], x["key_hash"]): x for x in led}
    mismatch = sum(1 for sv in served if sv.call_id not in rows)
    for k in set(want) | set(got):
        idx, x = want.get(k, []), got.get(k, {})
        lj = float(x.get("joules_measured", 0.0)) + float(x.get("joules_estimated", 0.0))
        rj = float(joules[idx].sum()) if idx else 0.0
        bad = int(x.get("requests", 0)) != len(idx) or abs(lj - rj) > 1e-6 * max(1.0, rj)
        mismatch += max(len(idx), int(x.get("requests", 0))) if bad else 0
    keys = np.array([r.key for r in day])
    spend = {k: float(sum(float(x["joules_measured"]) + float(x["joules_estimated"]) for kk, x in got.items()
                          if kk[1] == _hash(k))) for k in KEYS}  # fmt: skip
    co2e_led = {k: float(sum(float(x["co2e_g"]) for kk, x in got.items() if kk[1] == _hash(k)))
                for k in KEYS}  # fmt: skip
    return {"acc": acc, "joules": joules, "co2e": co2e, "keys": keys, "mismatch": mismatch, "spend": spend,
            "co2e_ledger": co2e_led, "sites": np.array([sv.site for sv in served]), "served": served}  # fmt: skip


def boot(f: Any, n: int, reps: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of ``f(idx)`` over ``reps`` resamples of ``n`` paired requests."""
    rng = np.random.default_rng(seed)
    vals = [f(rng.integers(0, n, n)) for _ in range(reps)]
    return float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))


def report(u: dict[str, Any], b: dict[str, Any], budget: float, best: tuple[float, np.ndarray]) -> str:
    team_a = np.isin(u["keys"], [k for k, (t, _) in KEYS.items() if t == "team-a"])
    spent = sum(b["spend"][k] for k, (t, _) in KEYS.items() if t == "team-a")
    err = abs(spent - budget) / budget * 100
    ia = np.flatnonzero(team_a)
    cost = 100 * (u["acc"][ia].mean() - b["acc"][ia].mean())
    lo, hi = boot(lambda j: 100 * (u["acc"][ia][j].mean() - b["acc"][ia][j].mean()), len(ia))
    log(
        f"team-a: budget {budget / 1e3:.0f} kJ, spent {spent / 1e3:.0f} kJ (unconstrained "
        f"{sum(u['spend'][k] for k in ('app-a1', 'app-a2')) / 1e3:.0f} kJ): error {err:.2f} %"
    )
    log(
        f"team-a accuracy: unconstrained {100 * u['acc'][ia].mean():.2f} %, "
        f"budgeted {100 * b['acc'][ia].mean():.2f} %: "
        f"cost {cost:.2f} points, 95 % [{lo:.2f}, {hi:.2f}] ({len(ia)} requests, paired bootstrap)"
    )
    lam, acc = best
    hlo, hhi = boot(lambda j: 100 * (b["acc"][ia][j].mean() - acc[j].mean()), len(ia))
    log(
        f"team-a, a constant λ = {lam:.3f} chosen with hindsight for the same estimated joules: accuracy "
        f"{100 * acc.mean():.2f} %; the multiplier's - hindsight: {100 * (b['acc'][ia].mean() - acc.mean()):+.2f} "
        f"points, 95 % [{hlo:+.2f}, {hhi:+.2f}]"
    )
    ib = np.flatnonzero(u["keys"] == "app-b1")
    saved = 100 * (1 - b["co2e_ledger"]["app-b1"] / u["co2e_ledger"]["app-b1"])
    slo, shi = boot(lambda j: 100 * (1 - b["co2e"][ib][j].sum() / u["co2e"][ib][j].sum()), len(ib))
    dacc = 100 * (b["acc"][ib].mean() - u["acc"][ib].mean())
    alo, ahi = boot(lambda j: 100 * (b["acc"][ib][j].mean() - u["acc"][ib][j].mean()), len(ib))
    log(
        f"app-b1 gCO2e: joules objective {u['co2e_ledger']['app-b1']:.2f} g, "
        f"carbon objective {b['co2e_ledger']['app-b1']:.2f} g: saved {saved:.1f} %, 95 % [{slo:.1f}, {shi:.1f}]; "
        f"joules {u['joules'][ib].sum() / 1e3:.0f} -> {b['joules'][ib].sum() / 1e3:.0f} kJ; "
        f"served in north {100 * (u['sites'][ib] == 'north').mean():.0f} % -> "
        f"{100 * (b['sites'][ib] == 'north').mean():.0f} %"
    )
    log(
        f"app-b1 accuracy: joules {100 * u['acc'][ib].mean():.2f} %, carbon {100 * b['acc'][ib].mean():.2f} %: "
        f"{dacc:+.2f} points, 95 % [{alo:+.2f}, {ahi:+.2f}] ({len(ib)} requests; equal within ±0.5: {abs(dacc) <= 0.5})"
    )
    return (
        f"budget_error_pct={err:.2f} acc_cost={cost:.2f} co2e_saved_pct={saved:.1f} "
        f"ledger_mismatch={u['mismatch'] + b['mismatch']}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3,000 requests (<= 5 min on 2 cores)")
    ap.add_argument("--requests", type=int, default=None, help="requests in the day (default 20,000; --quick 3,000)")
    ap.add_argument("--workdir", type=Path, default=Path("energy_day_work"))
    ap.add_argument("--budget-fraction", type=float, default=0.75, help="team-a's budget / its unconstrained spend")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    n = a.requests or (3000 if a.quick else 20000)
    a.workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    records, ckpt, cands = prepare(a.workdir)
    csv = intensity_csv(a.workdir / "intensity.csv")
    day_start = math.floor(time.time() / 86400) * 86400  # today (UTC), so the ledger's real day is the simulated one
    day = make_day(n, len(records), day_start, a.seed)
    log(f"{n} requests, {len(records)} distinct prompts, {len(cands)} candidates x {len(SITES)} sites")
    from litellm_energy_router.router.runtime import RouterRuntime

    rt = RouterRuntime(ckpt, cache_size=8192, threads=1, background=False)  # one scorer for both runs
    warm(rt, {records[r.prompt].prompt for r in day})
    log(f"scorer ready, {len({r.prompt for r in day})} distinct prompts scored")
    s_u = settings(a.workdir, "unconstrained", ckpt, csv, cands, {})
    log("run 1: unconstrained (objective joules, no budget)")
    u = outcome(day, replay(day, records, s_u, rt, day_start, csv), records, s_u.table.url)
    budget = a.budget_fraction * (u["spend"]["app-a1"] + u["spend"]["app-a2"])
    lam_c, p_acc = carbon_lambda(day, [r.prompt for r in records], rt, s_u)
    log(
        f"app-b1: carbon λ = {lam_c:.4f} per reference gram matches the joules run's predicted accuracy "
        f"{100 * p_acc:.2f} %"
    )
    extra = {"knob": {"per_key": {"app-b1": {"objective": "carbon", "lambda": lam_c}}},
             "budgets": {"refresh_s": 0.25,
                         "teams": {"team-a": {"limit": budget, "pace": hourly_traffic()}}}}  # fmt: skip
    s_b = settings(a.workdir, "budgeted", ckpt, csv, cands, extra)
    log(f"run 2: team-a soft budget {budget / 1e3:.0f} kJ/day, app-b1 objective carbon")
    b = outcome(day, replay(day, records, s_b, rt, day_start, csv), records, s_b.table.url)
    line = report(u, b, budget, hindsight(day, b["served"], records, rt))
    rt.close()
    log(f"done in {time.time() - t0:.0f} s")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
