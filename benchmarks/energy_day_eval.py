"""The day of ``energy_day.py``: who sends what (keys, teams, sites, the global λ), and the evaluation of its
two runs (accuracy, joules and gCO2e per request from the table rows; the ledger check; the carbon λ matched
before the run; a constant λ chosen with hindsight; paired bootstrap intervals; the last line)."""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

KEYS = {"app-a1": ("team-a", 0.35), "app-a2": ("team-a", 0.25), "app-b1": ("team-b", 0.40)}
SITES = {"north": ("N", 1.1), "south": ("S", 1.3)}
LAMBDA = 0.05  # the global knob: accuracy per 100 J


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()  # the key's hash, as LiteLLM's user_api_key_hash


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


@dataclass
class Req:
    t: float  # simulated arrival, Unix s
    key: str
    prompt: int  # index into the served records


@dataclass
class Served:
    call_id: str
    deployment: str
    candidate: str
    site: str


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
    spend = {
        k: float(
            sum(
                float(x["joules_measured"]) + float(x["joules_estimated"]) for kk, x in got.items() if kk[1] == _hash(k)
            )
        )
        for k in KEYS
    }
    co2e_led = {k: float(sum(float(x["co2e_g"]) for kk, x in got.items() if kk[1] == _hash(k))) for k in KEYS}
    return {
        "acc": acc,
        "joules": joules,
        "co2e": co2e,
        "keys": keys,
        "mismatch": mismatch,
        "spend": spend,
        "co2e_ledger": co2e_led,
        "sites": np.array([sv.site for sv in served]),
        "served": served,
    }


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
