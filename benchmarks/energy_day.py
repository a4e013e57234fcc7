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
and above, team-a's accuracy under a constant λ chosen with hindsight to spend the same estimated joules
(what the multiplier should match);
``ledger_mismatch`` = served requests whose joules are not exactly once in the ledger, both runs.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import logging
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import _offline  # noqa: F401  (before LiteLLM is imported)
from energy_day_eval import KEYS, LAMBDA, SITES, Req, Served, _hash, carbon_lambda, hindsight, log, outcome, report

GROUP = "day-pool"
CONCURRENCY = 32


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
    from litellm_energy_router.profiling.routerbench import bundled_files, import_routerbench, iter_records
    from litellm_energy_router.training.baselines import export_baseline
    from litellm_energy_router.training.data import holdout_split, load_matrix

    from litellm_energy_router.energy.profile import load_profile
    from litellm_energy_router.table import open_store

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
    return Settings.model_validate(
        {
            "table": {"url": f"sqlite:///{db}"},
            "router": {"checkpoint": str(ckpt), "timeout_ms": 10000, "cache_size": 8192},
            "candidates": [{"name": c} for c in cands],
            "knob": {"lambda": LAMBDA, **extra.get("knob", {})},
            "energy": {"meter": "estimate"},
            "writer": {"spool_dir": str(workdir / f"spool-{name}"), "flush_interval_s": 0.2},
            "carbon": {"intensity_csv": str(csv), "sites": {s: {"region": r, "pue": p} for s, (r, p) in SITES.items()}},
            "budgets": extra.get("budgets", {}),
        }
    )


# -- one day through LiteLLM ----------------------------------------------------------------------------


async def _replay(
    day: list[Req], prompts: list[str], api_base: str, s: Any, rt: Any, clock: SimClock, table: Any
) -> list[Served]:
    import litellm

    from litellm_energy_router.budgets import BudgetBook
    from litellm_energy_router.demo.backend import deployment
    from litellm_energy_router.energy.carbon import CarbonModel
    from litellm_energy_router.litellm_glue.callback import EnergyLogger
    from litellm_energy_router.litellm_glue.callback.accounting import RowAccounting
    from litellm_energy_router.litellm_glue.figures import Accounting
    from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
    from litellm_energy_router.litellm_glue.strategy import EnergyRouterCore, EnergyRoutingStrategy

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
        md = {"user_api_key_alias": r.key, "user_api_key_team_id": team, "user_api_key_hash": _hash(r.key)}
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
                f"{i / (last - t0):.0f} req/s" + (" " + _budget_line(core) if core.budgets else "")
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
        return asyncio.run(
            _replay(
                day, [r.prompt for r in records], backend.base_url, s, rt, SimClock(day_start), load_intensity_csv(csv)
            )
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
    extra = {
        "knob": {"per_key": {"app-b1": {"objective": "carbon", "lambda": lam_c}}},
        # pending_s in real seconds: this replay runs a day in minutes and writes each row within a second
        "budgets": {
            "refresh_s": 0.25,
            "pending_s": 1.0,
            "teams": {"team-a": {"limit": budget, "pace": hourly_traffic()}},
        },
    }
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
