"""Energy and carbon budgets per LiteLLM key and team (settings ``budgets``; docs/accounting.md).

A budget caps a key's (``budgets.keys.<key alias>``) or a team's (``budgets.teams.<team alias or id>``)
joules or gCO2e per UTC day or month. A request is matched on LiteLLM's authenticated
``user_api_key_alias`` / ``user_api_key_team_alias`` / ``user_api_key_team_id`` (never on anything else a
caller sends).

**Soft** (every budget): an online primal-dual multiplier μ ≥ 0 per budget, added to the request's λ
(its knob's objective, joules or carbon). Each refresh tick (every ``budgets.refresh_s`` seconds, off the
request path) the spend S(t) and the pace B·F(t) are read (F: the elapsed share of the period, by hour,
weighted by ``pace``, the expected traffic per UTC hour; uniform when unset) and::

    z ← z + η · (ΔS − B·ΔF) / B,    μ = max(0, z)

with ΔS, ΔF the changes since the previous tick: the dual (sub)gradient step on the period's constraint
S(T) ≤ B, whose gradient over one tick is the spend in it minus the budget's share of it, with the
projection on μ ≥ 0 taken lazily (dual averaging): z sums the steps unprojected, so within a period
μ = max(0, z₀ + η (S(t) − B·F(t)) / B) — η times how far spend runs ahead of pace, as a share of B, whatever
the tick rate. μ rises while spend runs ahead of pace and falls (to 0 at most) while it runs behind;
spend behind pace is banked, not forgotten (an eager max(0, ·) at every tick would turn the per-tick noise
of spend into a positive μ and end the period under budget). Spend settles on the pace with μ at the value
μ* that holds it there: one λ for the whole period, what spends the budget with the smallest accuracy cost
when the traffic mix does not change. A cold start (z₀ = 0) ends the period about μ*/η of B over budget;
at a new period z₀ = the last μ (spend and pace start from 0 again), which removes that offset. η (``eta``)
is in λ units per whole budget of overspend: η = 10 adds 0.1 to λ while spend runs 1 % of B ahead.

**Hard** (``mode: hard``): once the spend reaches B, requests are refused with HTTP 429 (``BudgetExceeded``,
one line naming the budget) or, with ``hard_action: cheapest``, served by the cheapest candidate in the
request's objective. Fail closed: a hard budget whose spend is unknown (no ledger read since the process started,
or none that succeeded for ``max_stale_s``) is treated as exhausted, so a proxy that starts, or loses its table,
never serves a capped key on a spend it cannot see.

**Spend and staleness.** Spend = the ledger's sum for the budget's period (``er_ledger``, written by every
proxy's callback in the row's transaction) at the last read + the decision-time estimates (Ê, or its gCO2e)
of the requests this process routed (a request it did not decide: its budget's typical charge; one being scored:
the same, until decided) in the ``pending_s`` (300 s) before that read started, and since: a request
counts locally from its decision until its row can be in the ledger (a stream of minutes included), and the
overlap with the ledger is at most ``pending_s`` of this process's traffic, counted twice (the safe side). A
background thread reads the table every ``refresh_s``; nothing on the request path touches the table. A request served by any proxy sharing the
table is in every proxy's spend at most ``refresh_s`` + that proxy's ``writer.flush_interval_s`` + its
energy settle time (0 with the ``estimate`` meter; ``energy.settle_timeout_s`` at most) after it ended,
plus one table read; this process's own requests count from their decision on.
"""

from __future__ import annotations

import calendar
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from litellm_energy_router.metrics import RateLimitedWarning

log = logging.getLogger("litellm_energy_router")
CHEAPEST_LAMBDA = 1e9  # hard_action cheapest: λ at which the cheapest candidate in the objective always wins


class Budget(BaseModel):
    """One key's or team's budget."""

    model_config = ConfigDict(extra="forbid")

    limit: float = Field(gt=0, le=1e18, allow_inf_nan=False, description="the budget per period, in `unit`")
    unit: Literal["joules", "gco2e"] = Field("joules", description="joules (measured + estimated) or grams of CO2e")
    period: Literal["day", "month"] = Field("day", description="UTC day or UTC month")
    mode: Literal["soft", "hard"] = Field("soft", description="soft: the multiplier only; hard: and a cap at the limit")
    hard_action: Literal["refuse", "cheapest"] = Field(
        "refuse", description="over a hard cap: HTTP 429, or the cheapest candidate"
    )
    eta: float = Field(
        10.0, ge=0, le=1e6, allow_inf_nan=False, description="step size η: λ units per whole budget of overspend"
    )
    pace: list[float] | None = Field(None, description="24 weights: expected traffic per UTC hour (None: uniform)")

    @field_validator("pace")
    @classmethod
    def _pace(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (
            len(v) != 24 or not all(math.isfinite(x) and x >= 0 for x in v) or not 0 < sum(v) < math.inf
        ):  # 24 weights of 1e308 each are finite, their sum is not (the pace was NaN: the budget never bound)
            raise ValueError("must be 24 finite weights >= 0, one per UTC hour, not all 0")
        return v


class BudgetSettings(BaseModel):
    """Budgets per key and team (settings section ``budgets``)."""

    model_config = ConfigDict(extra="forbid")

    refresh_s: float = Field(
        5.0, gt=0, le=3600, allow_inf_nan=False, description="seconds between ledger reads (and μ updates)"
    )
    keys: dict[str, Budget] = Field(default_factory=dict, description="LiteLLM key alias -> budget")
    teams: dict[str, Budget] = Field(default_factory=dict, description="LiteLLM team alias or team id -> budget")
    pending_s: float = Field(
        300.0,
        ge=0,
        le=86400,
        allow_inf_nan=False,
        description="seconds a routed request's decision-time estimate stays in this process's spend before the "
        "ledger read that follows them (its row is written when the request ends: a long stream, the settle time)",
    )
    max_stale_s: float | None = Field(
        None,
        gt=0,
        le=86400,
        allow_inf_nan=False,
        description="a hard budget whose spend has not been read from the table for this many seconds (or not yet "
        "since start) refuses like an exhausted one, fail closed; None: 3 x refresh_s, at least 30",
    )

    @model_validator(mode="after")
    def _stale_after_refresh(self) -> "BudgetSettings":
        if self.max_stale_s is not None and self.max_stale_s <= self.refresh_s:
            raise ValueError(
                f"budgets.max_stale_s = {self.max_stale_s:g} must be more than budgets.refresh_s = {self.refresh_s:g} "
                "(a hard budget would refuse between two healthy reads)"
            )
        return self

    @property
    def stale_s(self) -> float:
        """Seconds without a ledger read after which a hard budget's spend counts as unknown."""
        return self.max_stale_s if self.max_stale_s is not None else max(3 * self.refresh_s, 30.0)


def check_budget_sources(budgets: BudgetSettings, ledger: bool, carbon: Any) -> None:
    """A budget reads its spend from the ledger, and a gCO2e one needs every deployment priced in grams: else it
    would never bind (0 spent for ever), which a hard cap must not do silently. Raises ValueError naming it."""
    named = {f"budgets.keys.{k}": b for k, b in budgets.keys.items()}
    named.update({f"budgets.teams.{k}": b for k, b in budgets.teams.items()})
    if named and not ledger:
        raise ValueError(f"{next(iter(named))}: budgets read their spend from the ledger; set accounting.ledger: true")
    grams = [n for n, b in named.items() if b.unit == "gco2e"]
    if grams and carbon.default_site is None:  # a provider prices a region, it gives no deployment a site
        raise ValueError(
            f"{grams[0]}: unit gco2e needs every deployment priced in grams: set carbon.default_site "
            "(a deployment without model_info.energy_router_site has no carbon intensity)"
        )


class BudgetExceeded(Exception):
    """A request over a hard budget. LiteLLM reads ``status_code`` (the proxy answers 429 with ``message``);
    ``str(err)`` is one line naming the budget."""

    status_code = 429
    type = "budget_exceeded"
    param = "budgets"

    def __init__(self, where: str, spent: float, b: Budget, unknown_s: float | None = None) -> None:
        unit = "J" if b.unit == "joules" else "gCO2e"
        self.message = (
            f"energy-router: budget {where} exhausted: {spent:.6g} of {b.limit:.6g} {unit} this {b.period}"
            if unknown_s is None
            else f"energy-router: budget {where} spend unknown (no ledger read in the last {unknown_s:.6g} s): "
            "a hard budget refuses until the table is read"
        )
        super().__init__(self.message)


# -- the period and its pace -------------------------------------------------------------------------------


def period_start(t_s: float, period: str) -> datetime:
    """Start (UTC) of the day or month holding Unix time ``t_s``."""
    d = datetime.fromtimestamp(math.floor(t_s), tz=timezone.utc)  # floored as the ledger's day: never rounded up
    return d.replace(hour=0, minute=0, second=0, microsecond=0, **({"day": 1} if period == "month" else {}))


def _day_share(t_in_day_s: float, pace: list[float] | None) -> float:
    h, frac = divmod(t_in_day_s / 3600.0, 1.0)
    if pace is None:
        return t_in_day_s / 86400.0
    return (sum(pace[: int(h)]) + pace[int(h)] * frac) / sum(pace)


def elapsed_share(t_s: float, period: str, pace: list[float] | None = None) -> float:
    """F(t): the share of the period's budget the pace allows by ``t_s`` (0 at its start, 1 at its end);
    hours weighted by ``pace`` (each day of a month alike)."""
    start = period_start(t_s, period)
    s = t_s - start.timestamp()
    if period == "day":
        return _day_share(s, pace)
    days = calendar.monthrange(start.year, start.month)[1]
    d, rest = divmod(s, 86400.0)
    return (d + _day_share(rest, pace)) / days


# -- the per-process book ------------------------------------------------------------------------------------


@dataclass(eq=False)
class BudgetState:
    """One budget's view in this process."""

    scope: str  # "key" or "team"
    name: str
    cfg: Budget
    table: float = 0.0  # ledger sum of the period at the last read
    local: float = 0.0  # this process's decision-time estimates not yet dropped (sum of ``charges``)
    charges: deque = field(default_factory=deque)  # [second, latest time, sum] (monotonic s): what ``local`` holds
    mu: float = 0.0
    z: float = 0.0  # the dual state before the projection: μ = max(0, z)
    period: str = ""
    last_spent: float = 0.0
    last_pace: float = 0.0
    reads: int = 0
    read_ok: float = -math.inf  # time.monotonic() of the last ledger read that succeeded
    table_period: str = ""  # the period ``table`` was read in
    typical: float = 0.0  # a routed request's charge, smoothed (:data:`TYPICAL_WEIGHT`): what an undecided one counts
    held: float = 0.0  # requests admitted and not yet decided, at ``typical`` each (:meth:`BudgetBook.hold`)

    @property
    def where(self) -> str:
        return f"{self.scope}s.{self.name}"

    @property
    def spent(self) -> float:
        return self.table + self.local + self.held

    def period_of(self, now_s: float) -> str:
        """The period holding ``now_s`` (Unix s), ``YYYY-MM-DD`` of its first day."""
        return period_start(now_s, self.cfg.period).strftime("%Y-%m-%d")

    def step(self, now_s: float) -> None:
        """One multiplier update at ``now_s`` (the module docstring's rule)."""
        start = self.period_of(now_s)
        if start != self.period:  # a new period: spend and pace start from 0, μ carries over
            self.period, self.last_spent, self.last_pace, self.z = start, 0.0, 0.0, self.mu
        spent, pace = self.spent, self.cfg.limit * elapsed_share(now_s, self.cfg.period, self.cfg.pace)
        self.z += self.cfg.eta * ((spent - self.last_spent) - (pace - self.last_pace)) / self.cfg.limit
        self.mu = max(0.0, self.z)
        self.last_spent, self.last_pace = spent, pace


class WriterLag:
    """Since when (``time.monotonic()`` s) this process's table writer has rows it has not committed (a write in
    flight, a table down or locked, a spool backlog), or ``None``. The budgets keep their local charges from
    ``pending_s`` before then: a charge is dropped only once its row can be in the ledger, so a writer stalled behind
    another proxy's lock or an outage does not let a hard budget's spend fall back to a ledger that misses its rows
    (6 x 60 J were admitted under a 100 J cap)."""

    def __init__(self) -> None:
        self.since: float | None = None

    def behind(self) -> None:
        if self.since is None:
            self.since = time.monotonic()

    def caught_up(self) -> None:
        self.since = None


WRITER_LAG = WriterLag()  # set by the table writer (litellm_glue/callback), read by every BudgetBook of the process

TYPICAL_WEIGHT = 0.2  # weight of the latest charge in a budget's typical per-request charge (an EWMA)


def _add(st: BudgetState, v: float, now: float) -> None:
    """``v`` into ``st``'s local spend at ``now`` (monotonic s), one entry per second (bounded); under the lock."""
    st.local += v
    if st.charges and st.charges[-1][0] == int(now):
        st.charges[-1][1:] = [now, st.charges[-1][2] + v]
    else:
        st.charges.append([int(now), now, v])


class BudgetBook:
    """Budgets of one process: matches requests, adjusts their knob, counts local spend, and refreshes spend
    and multipliers from the ledger on a thread of its own (:meth:`start`).

    Args:
        cfg: the ``budgets`` settings.
        table_url: the table whose ``er_ledger`` all proxies write.
        clock: Unix time now (a benchmark's simulated day).
    """

    def __init__(self, cfg: BudgetSettings, table_url: str, *, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.url = table_url
        self.clock = clock
        self.keys = {n: BudgetState("key", n, b) for n, b in cfg.keys.items()}
        self.teams = {n: BudgetState("team", n, b) for n, b in cfg.teams.items()}
        self.states = [*self.keys.values(), *self.teams.values()]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._engine: Any = None
        self._warn = RateLimitedWarning(log, 60.0)
        self.read_started = 0.0  # time.monotonic() when the last ledger read began

    def match(self, mds: list[dict[str, Any]]) -> list[BudgetState]:
        """The budgets of a request (its metadata dicts): its key's, then its team's."""
        out: list[BudgetState] = []
        for md in mds:
            for key_field, book in (
                ("user_api_key_alias", self.keys),
                ("user_api_key_team_alias", self.teams),
                ("user_api_key_team_id", self.teams),
            ):
                v = md.get(key_field)
                st = book.get(str(v)) if v is not None else None
                if st is not None and st not in out:
                    out.append(st)
        return out

    def apply(self, knob: Any, states: list[BudgetState]) -> Any:
        """``knob`` with λ raised by the budgets' multipliers (the cheapest-candidate λ over a hard cap with
        ``hard_action: cheapest``); raises :class:`BudgetExceeded` over a hard cap with ``refuse``. A hard budget
        whose spend is unknown (no ledger read for ``max_stale_s``, or none yet) counts as over its cap: fail closed."""
        mu, cheapest, stale, over = 0.0, False, self.cfg.stale_s, []
        for st in states:
            if st.cfg.mode == "hard":
                unknown = time.monotonic() - st.read_ok > stale
                if unknown or st.spent >= st.cfg.limit:
                    if st.cfg.hard_action == "refuse":
                        raise BudgetExceeded(st.where, st.spent, st.cfg, stale if unknown else None)
                    cheapest = True
                    over.append(st)
            mu += st.mu
        if cheapest:  # cheapest in the exhausted budgets' unit, not the objective the caller chose
            objective = "carbon" if all(st.cfg.unit == "gco2e" for st in over) else "joules"
            return knob.model_copy(update={"lambda_": CHEAPEST_LAMBDA, "target_accuracy": None, "objective": objective})
        return knob.model_copy(update={"lambda_": knob.lambda_ + mu}) if mu > 0 else knob

    def charge(self, states: list[BudgetState], figures: Mapping[str, Any] | None) -> None:
        """Add a routed request's decision-time estimate to its budgets' local spend."""
        if not states or not figures:
            return
        now = time.monotonic()
        with self._lock:
            for st in states:
                v = figures.get("co2e_grams_estimate" if st.cfg.unit == "gco2e" else "joules_estimate")
                if v is not None:
                    v = float(v)
                    st.typical = v if st.typical <= 0 else st.typical + TYPICAL_WEIGHT * (v - st.typical)
                    _add(st, v, now)

    def charge_unrouted(self, states: list[BudgetState]) -> None:
        """A request the router did not decide (it failed open: LiteLLM picks) spends all the same: counted at its
        budgets' typical charge until its row is in the ledger."""
        now = time.monotonic()
        with self._lock:
            for st in states:
                if st.typical > 0:
                    _add(st, st.typical, now)

    def hold(self, states: list[BudgetState]) -> list[tuple[BudgetState, float]]:
        """Count a request admitted and not yet decided (its score awaited) at its budgets' typical charge, so the
        requests admitted beside it see it; :meth:`release` what this returns once it is decided or failed."""
        with self._lock:
            held = [(st, st.typical) for st in states if st.typical > 0]
            for st, v in held:
                st.held += v
        return held

    def release(self, held: list[tuple[BudgetState, float]]) -> None:
        with self._lock:
            for st, v in held:
                st.held = max(st.held - v, 0.0)

    # -- refresh ------------------------------------------------------------------------------------------
    def _read(self, now_s: float) -> dict[int, float]:
        from litellm_energy_router.table import ledger, open_store

        if self._engine is None:
            self._engine = open_store(self.url).engine
        with self._engine.connect() as conn:
            day = {id(st): period_start(now_s, st.cfg.period).strftime("%Y-%m-%d") for st in self.states}
            return {id(st): ledger.spend(conn, st.scope, st.name, day[id(st)], st.cfg.unit) for st in self.states}

    def tick(self) -> None:
        """Read every budget's spend from the ledger, then update the multipliers (the refresher's step)."""
        now = self.clock()
        with self._lock:
            self.read_started = time.monotonic()
        try:
            sums = self._read(now)
        except Exception as e:  # noqa: BLE001 - a table outage keeps the last view (and the local spend)
            self._warn(
                "budgets", "energy-router: budget spend not refreshed: %s", str(e).splitlines()[0] if str(e) else e
            )
            sums = None
        with self._lock:
            for st in self.states:
                period = st.period_of(now)
                if sums is not None:  # table first: a lock-free reader may see the spend high, never low
                    st.table = sums[id(st)]
                    old = self.read_started - self.cfg.pending_s  # charged before: its row is in what was read
                    if WRITER_LAG.since is not None:  # unless this process's writer has been behind since then
                        old = min(old, WRITER_LAG.since - self.cfg.pending_s)
                    while st.charges and st.charges[0][1] < old:  # its latest charge is older
                        st.local -= st.charges.popleft()[2]
                    st.local = max(st.local, 0.0) if st.charges else 0.0
                    st.reads += 1
                    st.read_ok = time.monotonic()
                    st.table_period = period
                if st.table_period == period:  # a failed read across the period's end: μ kept, not
                    st.step(now)  # stepped against last period's full spend from 0 (it jumped to ≈ η at midnight)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.cfg.refresh_s)

    def start(self) -> "BudgetBook":
        """Start the refresher thread (it reads at once, then every ``refresh_s``)."""
        if self._thread is None and self.states:
            self._thread = threading.Thread(target=self._loop, name="energy-router-budgets", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
