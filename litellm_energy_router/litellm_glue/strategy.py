"""LiteLLM glue: pick one deployment per request with the learned router.

One core (:class:`EnergyRouterCore`) serves both entry points:

* :class:`EnergyRoutingStrategy` — SDK: a ``CustomRoutingStrategyBase`` for
  ``router.register_plugin(strategy)`` (or the deprecated ``set_custom_routing_strategy``). It honours
  cooldowns itself, because LiteLLM skips its healthy-deployment filtering for custom strategies.
* :class:`EnergyRouterFilter` — proxy (and SDK): a ``CustomLogger`` whose ``async_filter_deployments``
  narrows LiteLLM's already-healthy deployments of a model group to the chosen one, by
  ``model_info.id``. Enable it in a proxy ``config.yaml`` with
  ``litellm_settings.callbacks: ["litellm_energy_router.litellm_glue.proxy_router.energy_router"]``.

Candidates map to deployments by, in order: ``model_info.energy_router_candidate``; then
``settings.router.match_by``: ``id`` (candidate ``deployment_id`` or name = ``model_info.id``) or
``name`` (candidate name = ``litellm_params.model`` with or without its provider prefix); see
:mod:`.deployments`.

The knob (λ, target accuracy, energy budget ``max_energy_j``, objective) comes from request metadata
``energy_router``, else the caller's key in ``knob.per_key``, else the global ``knob``; λ is in accuracy
per ``knob.e_ref_j`` joules (fixed in the settings, so it means the same after every retrain), or per
reference gram with ``objective: carbon`` (then the chosen candidate's cleanest site serves). What a
request may override, within which bounds, is ``knob.policy`` (:mod:`.knob`). The key's and team's
budgets (:mod:`.budgets`) then raise λ by their multipliers, or refuse the request over a hard cap.

Fail-open: a router error, a timeout (``router.timeout_ms``), a missing checkpoint or no candidate in
the pool → the configured ``router.fallback`` deployment, else LiteLLM's own choice; a warning at
most once a minute and ``energy_router_fallbacks_total{reason}``. The request errors are the caller's: an
invalid request knob (:class:`~.knob.KnobError`, HTTP 400) and a request over a hard budget
(:class:`~.budgets.BudgetExceeded`, HTTP 429); raised before any backend call, from the proxy's pre-call
hook, an exception from the SDK.

The decision reaches the energy callback in-process (:data:`~.decision.DECISION_BOOK`), never through
request metadata: see :mod:`.decision`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any, Mapping, Sequence

import numpy as np
from litellm.integrations.custom_logger import CustomLogger
from litellm.types.router import CustomRoutingStrategyBase

from litellm_energy_router.budgets import BudgetBook, BudgetExceeded
from litellm_energy_router.knob import Knob, KnobError, metadata_dicts, resolve_knob
from litellm_energy_router.litellm_glue import litellm_compat
from litellm_energy_router.litellm_glue.decision import (
    DECISION_BOOK,
    DECISION_KEY,
    Decision,
    DecisionBook,
)
from litellm_energy_router.litellm_glue.deployments import CandidateMap, deployment_keys
from litellm_energy_router.litellm_glue.figures import (
    Accounting,
    carbon_factors,
    headers,
)
from litellm_energy_router.litellm_glue.request_text import query_text
from litellm_energy_router.metrics import (
    DECISION_SECONDS,
    DECISIONS,
    FALLBACKS,
    RateLimitedWarning,
)
from litellm_energy_router.router.adapt import ADAPT, start_refresh
from litellm_energy_router.router.context import Context
from litellm_energy_router.router.decide import decide
from litellm_energy_router.router.length_model import (
    bounded_energy,
    bounded_note,
    context_bounded_energy,
    request_max_tokens,
)
from litellm_energy_router.router.online import explore_pick
from litellm_energy_router.router.runtime import (
    NoCheckpoint,
    RouterLoading,
    RouterRuntime,
    Scored,
)
from litellm_energy_router.settings import Settings, load_settings

log = logging.getLogger("litellm_energy_router")
HEADERS_BOOK = DecisionBook()  # proxy decisions whose figures the response-headers hook has not sent yet
CALLER_ERRORS = (KnobError, BudgetExceeded)  # refused, never failed open


class EnergyRouterCore:
    """Shared decision path of the strategy, the proxy filter and ``energy-router route``."""

    def __init__(
        self, settings: Settings | None = None, runtime: RouterRuntime | None = None, budgets: BudgetBook | None = None
    ) -> None:
        self.settings = settings or load_settings()
        rs = self.settings.router
        self.runtime = runtime or RouterRuntime(
            rs.checkpoint,
            batch_wait_ms=rs.batch_wait_ms,
            cache_size=rs.cache_size,
            threads=rs.threads,
            scorer=rs.scorer,
        )  # inside the proxy's event loop this loads on a thread: requests fail open ("loading") until ready
        self._cmap = CandidateMap(self.settings.candidates)
        self._context = {c.name: c.context_tokens for c in self.settings.candidates if c.context_tokens}
        self._warn = RateLimitedWarning(log, 60.0)
        self._rng = random.Random()
        self.accounting = Accounting(self.settings)
        self.adapt = ADAPT  # what production teaches between retrains (router/adapt.py); router.online: used or not
        if rs.online and rs.context_refresh_s > 0:
            start_refresh(self.adapt, self.runtime, self.settings.table.url, rs.context_refresh_s)
        b = self.settings.budgets
        self.budgets = budgets or (BudgetBook(b, self.settings.table.url).start() if b.keys or b.teams else None)

    # -- request → knob, text ---------------------------------------------------------------------
    def knob(self, request_kwargs: Mapping[str, Any] | None) -> Knob:
        """The request's :class:`~.knob.Knob`: request metadata beats the per-key default, which beats
        the global one; λ raised by its budgets' multipliers. Raises :class:`~.knob.KnobError` for a request
        value ``knob.policy`` refuses, :class:`~.budgets.BudgetExceeded` over a hard budget that refuses."""
        knob = resolve_knob(self.settings.knob, request_kwargs)
        if self.budgets is None:
            return knob
        return self.budgets.apply(knob, self.budgets.match(metadata_dicts(request_kwargs)))

    def _known(self) -> set[str]:
        model = self.runtime.model
        return self._cmap.names or (set(model.candidates) if model is not None else set())

    def candidate_of(self, deployment: Mapping[str, Any] | None, known: set[str] | None = None) -> str | None:
        """The candidate a deployment serves, or ``None`` when it is not one of the router's (with no
        candidate known yet, e.g. while the checkpoint loads: its id or model string). ``known``: :meth:`_known`."""
        dep_id, model, tag = deployment_keys(deployment)
        known = self._known() if known is None else known
        by = self.settings.router.match_by
        if not known and not tag:
            return dep_id if by == "id" else model
        return self._cmap.lookup(dep_id, model, tag, known, by=(by,))

    # -- decision ---------------------------------------------------------------------------------
    def _fallback(
        self, deployments: Sequence[Mapping[str, Any]], reason: str, detail: str = ""
    ) -> tuple[Any, Decision]:
        FALLBACKS.labels(reason=reason).inc()
        self._warn(reason, "energy-router: falling back (%s) %s", reason, detail)
        fb = self.settings.router.fallback
        chosen = None
        if fb:
            chosen = next((d for d in deployments if fb in (_dep_id(d), self.candidate_of(d))), None)
        return chosen, Decision(
            candidate=self.candidate_of(chosen) if chosen else None,
            deployment_id=_dep_id(chosen),
            fallback=reason,
            router_version=self.runtime.version,
        )

    def pool(self, deployments: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
        """The request's deployments by the candidate they serve (those serving none left out); mapped
        once per request."""
        by_cand: dict[str, list[Mapping[str, Any]]] = {}
        known = self._known()
        for d in deployments:
            c = self.candidate_of(d, known)
            if c is not None:
                by_cand.setdefault(c, []).append(d)
        return by_cand

    def context_lengths(
        self, candidates: Sequence[str], by_cand: Mapping[str, Sequence[Mapping[str, Any]]]
    ) -> np.ndarray | None:
        """Context length (tokens, prompt + output; inf: none known) per candidate, or None when no candidate has
        one: the largest ``model_info.max_input_tokens`` of its deployments in the pool, else its
        ``candidates[].context_tokens`` setting."""
        out, known = np.full(len(candidates), np.inf), False
        for k, c in enumerate(candidates):
            vals = [
                v
                for d in by_cand.get(c, ())
                if type(v := (d.get("model_info") or {}).get("max_input_tokens")) is int and v > 0
            ]
            n = max(vals) if vals else self._context.get(c)
            if n:
                out[k], known = float(n), True
        return out if known else None

    def decide(
        self,
        scored: Scored,
        deployments: Sequence[Mapping[str, Any]],
        knob: Knob,
        t0: float,
        by_cand: dict[str, list[Mapping[str, Any]]] | None = None,
        request_kwargs: Mapping[str, Any] | None = None,
        ctx: Context | None = None,
    ) -> tuple[Any, Decision]:
        """(deployment, decision): :func:`~.router.decide.decide` over the candidates in the pool
        (``by_cand``: :meth:`pool`, when the caller mapped it already), on P and Ê adapted to the request's
        context ``ctx`` (:mod:`.router.adapt`), Ê bounded by its ``max_tokens``, then ε-exploration
        (``router.epsilon``, spread by energy uncertainty) and a deployment of the chosen candidate."""
        by_cand = self.pool(deployments) if by_cand is None else by_cand
        avail = [j for j, c in enumerate(scored.candidates) if c in by_cand]
        if not avail:
            return self._fallback(
                deployments, "no_candidate", f"pool {sorted(by_cand)} vs router {list(scored.candidates)}"
            )
        self.adapt.bind(self.runtime.model)
        max_tokens = request_max_tokens(request_kwargs)
        ctx_len = self.context_lengths(scored.candidates, by_cand)
        E_all = context_bounded_energy(
            bounded_energy(scored.E, scored.tokens, scored.j_out, max_tokens),
            scored.tokens,
            scored.prompt_tokens,
            scored.j_prompt,
            scored.j_out,
            max_tokens,
            ctx_len,
        )
        P_all, E_all, explore, adapt = self.adapt.apply(
            scored, ctx, E_all, self.settings.router.epsilon > 0, self.settings.router.context_rows
        )
        P, E = P_all[avail][None, :], E_all[avail][None, :]
        factors, cleanest = None, {}
        if knob.objective == "carbon" and self.accounting.carbon.enabled:
            names = [scored.candidates[j] for j in avail]
            factors, cleanest = carbon_factors(self.accounting.carbon, names, by_cand, time.time())
        j_best = int(decide(P, E, knob, factors)[0])
        j, propensity = explore_pick(
            self._rng, self.settings.router.epsilon, j_best, explore[avail] if explore is not None else None, len(avail)
        )
        cand = scored.candidates[avail[j]]
        dep = cleanest.get(cand) or self._rng.choice(by_cand[cand])
        dt = time.perf_counter() - t0
        DECISIONS.labels(candidate=cand).inc()
        DECISION_SECONDS.observe(dt)
        return dep, Decision(
            candidate=cand,
            deployment_id=_dep_id(dep),
            scores={scored.candidates[i]: round(float(P_all[i]), 5) for i in range(len(scored.candidates))},
            energy_j={scored.candidates[i]: round(float(E_all[i]), 3) for i in range(len(scored.candidates))},
            energy_note=bounded_note(scored.note, scored.candidates, max_tokens, scored.prompt_tokens, ctx_len),
            lambda_=None if knob.target_accuracy is not None else knob.lambda_,
            target_accuracy=knob.target_accuracy,
            max_energy_j=knob.max_energy_j,
            propensity=round(propensity, 6),
            router_version=scored.version,
            latency_ms=round(dt * 1000, 3),
            adapt=adapt,
        )

    def _plan(
        self,
        deployments: Sequence[Mapping[str, Any]],
        messages: Any,
        input: Any,
        request_kwargs: Mapping[str, Any] | None,
    ) -> tuple[str, Knob, dict[str, list[Mapping[str, Any]]], Context | None] | None:
        """(text, knob, deployments by candidate, context) to route on, or ``None`` to pass the request through
        unrouted (a model group that is not the router's pool, or no text). The knob is checked first: an
        invalid one is refused whichever model group the request is for."""
        knob = self.knob(request_kwargs)
        by_cand = self.pool(deployments)
        if not by_cand:
            return None
        text = query_text(messages, prompt=(request_kwargs or {}).get("prompt"), input=input)
        if text is None:
            return None
        group = next((d.get("model_name") for d in deployments if d.get("model_name")), None)
        ctx = self.adapt.context(text, request_kwargs, messages, group) if self.settings.router.online else None
        return text, knob, by_cand, ctx

    def _account(
        self, request_kwargs: Mapping[str, Any] | None, dep: Any, decision: Decision | None
    ) -> tuple[Any, Decision | None]:
        """Attach the decision-time energy and carbon figures (:mod:`.figures`) and charge them to the request's
        budgets' local spend; never fails the request."""
        if decision is not None and dep is not None:
            try:
                decision.figures = self.accounting.estimate(decision, dep)
                if self.budgets is not None:
                    self.budgets.charge(self.budgets.match(metadata_dicts(request_kwargs)), decision.figures)
            except Exception as e:  # noqa: BLE001 - accounting must not fail routing
                self._warn("figures", "energy-router: no energy figures: %s", e)
        return dep, decision

    def _failed(self, deployments: Sequence[Mapping[str, Any]], e: BaseException) -> tuple[Any, Decision]:
        if isinstance(e, asyncio.TimeoutError):
            return self._fallback(deployments, "timeout", f"> {self.settings.router.timeout_ms} ms")
        return self._fallback(deployments, _reason(e), str(e).splitlines()[0] if str(e) else type(e).__name__)

    async def choose(
        self,
        deployments: Sequence[Mapping[str, Any]],
        messages: Any = None,
        input: Any = None,
        request_kwargs: Mapping[str, Any] | None = None,
    ) -> tuple[Any, Decision | None]:
        """(deployment or None for LiteLLM's own choice, decision or None when not routed)."""
        t0 = time.perf_counter()
        try:
            plan = self._plan(deployments, messages, input, request_kwargs)
            if plan is None:
                return None, None
            budget, rt = self.settings.router.timeout_ms / 1000, self.runtime
            # an inline scorer (the student) scores in place: no task and no loop turns for wait_for to add
            scored = rt.score_sync(plan[0]) if rt.inline else await asyncio.wait_for(rt.score(plan[0]), budget)
            if time.perf_counter() - t0 > budget:  # an in-place (student) score cannot be cut short
                raise asyncio.TimeoutError()
            decided = self.decide(scored, deployments, plan[1], t0, plan[2], request_kwargs, plan[3])
            return self._account(request_kwargs, *decided)
        except CALLER_ERRORS:
            raise  # the caller's error, not the router's: refused, not failed open
        except Exception as e:  # noqa: BLE001 - fail open, never fail the request
            return self._failed(deployments, e)

    def choose_sync(
        self,
        deployments: Sequence[Mapping[str, Any]],
        messages: Any = None,
        input: Any = None,
        request_kwargs: Mapping[str, Any] | None = None,
    ) -> tuple[Any, Decision | None]:
        """Sync twin of :meth:`choose` (LiteLLM's sync calls); the timeout is checked after scoring."""
        t0 = time.perf_counter()
        try:
            plan = self._plan(deployments, messages, input, request_kwargs)
            if plan is None:
                return None, None
            scored = self.runtime.score_sync(plan[0])
            if (time.perf_counter() - t0) * 1000 > self.settings.router.timeout_ms:
                raise asyncio.TimeoutError()
            decided = self.decide(scored, deployments, plan[1], t0, plan[2], request_kwargs, plan[3])
            return self._account(request_kwargs, *decided)
        except CALLER_ERRORS:
            raise
        except Exception as e:  # noqa: BLE001
            return self._failed(deployments, e)


def _reason(e: Exception) -> str:
    if isinstance(e, RouterLoading):
        return "loading"
    return "no_checkpoint" if isinstance(e, NoCheckpoint) else "error"


def _dep_id(d: Mapping[str, Any] | None) -> str | None:
    if not d:
        return None
    v = (d.get("model_info") or {}).get("id")
    return str(v) if v is not None else None


def strip_caller_decision(request_kwargs: Mapping[str, Any] | None) -> None:
    """Remove a caller-sent ``energy_router_decision`` from the request metadata (it is never read)."""
    for md in metadata_dicts(request_kwargs):
        md.pop(DECISION_KEY, None)


def attach(request_kwargs: dict[str, Any] | None, decision: Decision | None) -> None:
    """Record the decision for the energy callback (:data:`~.decision.DECISION_BOOK`, keyed by the
    request's metadata dict) and put a copy in the metadata for other callbacks; with no decision, drop
    whatever an earlier attempt or the caller left."""
    if request_kwargs is None:
        return
    strip_caller_decision(request_kwargs)
    mds = metadata_dicts(request_kwargs)
    if decision is None:
        for md in mds:
            DECISION_BOOK.discard(md)
        return
    if not mds:
        request_kwargs["metadata"] = {}
        mds = metadata_dicts(request_kwargs)
    mds[0][DECISION_KEY] = decision.as_metadata()
    DECISION_BOOK.put(mds[0], decision)


class EnergyRoutingStrategy(CustomRoutingStrategyBase):
    """SDK routing strategy. ``router.register_plugin(EnergyRoutingStrategy(router, settings))``."""

    def __init__(self, router: Any, settings: Settings | None = None, core: EnergyRouterCore | None = None) -> None:
        self.router = router
        self.core = core or EnergyRouterCore(settings)

    def _healthy(self, model: str) -> list[dict[str, Any]]:
        deps = litellm_compat.deployments(self.router, model)
        if not deps:
            return []
        ids = [str((d.get("model_info") or {}).get("id")) for d in deps]
        try:
            cooling = litellm_compat.cooling_ids(self.router, ids)
        except Exception:  # noqa: BLE001 - a cooldown store error must not fail routing
            cooling = set()
        healthy = [d for d, i in zip(deps, ids) if i not in cooling]
        return healthy or deps

    def _pool(self, model: str, specific_deployment: bool | None) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """(the pinned deployment when one is asked for by id, else None; the group's healthy deployments)."""
        if specific_deployment:
            d = litellm_compat.deployment_dict(self.router, model)
            if d is not None:
                return d, []
        deps = self._healthy(model)
        if not deps:
            raise ValueError(f"energy-router: no deployments for model group {model!r}")
        return None, deps

    async def async_get_available_deployment(
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: str | list[object] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, object] | None = None,
    ) -> Any:
        pinned, deps = self._pool(model, specific_deployment)
        if pinned is not None:
            attach(request_kwargs, None)  # type: ignore[arg-type]
            return pinned
        dep, decision = await self.core.choose(deps, messages, input, request_kwargs)
        attach(request_kwargs, decision)  # type: ignore[arg-type]
        return dep if dep is not None else random.choice(deps)

    def get_available_deployment(
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: str | list[object] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, object] | None = None,
    ) -> Any:
        pinned, deps = self._pool(model, specific_deployment)
        if pinned is not None:
            attach(request_kwargs, None)  # type: ignore[arg-type]
            return pinned
        dep, decision = self.core.choose_sync(deps, messages, input, request_kwargs)
        attach(request_kwargs, decision)  # type: ignore[arg-type]
        return dep if dep is not None else random.choice(deps)


class EnergyRouterFilter(CustomLogger):
    """Proxy entry point: narrows a model group's healthy deployments to the router's choice."""

    def __init__(self, settings: Settings | None = None, core: EnergyRouterCore | None = None) -> None:
        super().__init__()
        self._settings = settings
        self._core = core
        self._refused = RateLimitedWarning(log, 60.0)

    @property
    def core(self) -> EnergyRouterCore:
        if self._core is None:  # built on first use (or by start()), so importing strategy.py stays cheap
            self._core = EnergyRouterCore(self._settings)
        return self._core

    def start(self) -> None:
        """Build the core now, so the checkpoint starts loading at proxy start, not on the first request. A
        settings error is logged and retried on the first request (which then fails open)."""
        litellm_compat.quiet_refusals()  # a refused knob: our WARNING line, not the proxy's ERROR line
        try:
            self.core
        except Exception as e:  # noqa: BLE001 - never keep the proxy from starting
            log.error("energy-router: not started (%s); requests fail open until it can start", str(e).splitlines()[0])

    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list,
        messages: Any,
        request_kwargs: dict | None = None,
        parent_otel_span: Any = None,
    ) -> list[dict]:
        if not healthy_deployments:
            return healthy_deployments
        try:
            dep, decision = await self.core.choose(healthy_deployments, messages, None, request_kwargs)
            attach(request_kwargs, decision)
            if decision is not None and decision.figures and self.core.settings.accounting.headers:
                HEADERS_BOOK.put(metadata_dicts(request_kwargs)[0], decision)
        except CALLER_ERRORS:
            raise  # a caller error: the router raises it as is (status_code 400 or 429)
        except Exception as e:  # noqa: BLE001 - e.g. a bad config: never fail the request
            FALLBACKS.labels(reason="error").inc()
            log.warning("energy-router: filter error %s", e)
            return healthy_deployments
        return [dep] if dep is not None else healthy_deployments

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> None:
        """Proxy, before routing and before any backend call: drop a caller-sent decision and refuse an
        invalid request knob (:class:`~.knob.KnobError`; the proxy answers HTTP 400 naming the field) and, once
        the router has started, a request over a hard budget (:class:`~.budgets.BudgetExceeded`, HTTP 429)."""
        strip_caller_decision(data)
        try:  # the settings only, never the router: its checkpoint loads in start() / on first use
            settings = self._core.settings if self._core is not None else self._settings or load_settings()
        except Exception as e:  # noqa: BLE001 - e.g. a bad config: the filter fails open, so does this
            log.warning("energy-router: pre-call check skipped: %s", str(e).splitlines()[0] if str(e) else e)
            return None
        self._settings = settings
        try:
            if self._core is not None:
                self._core.knob(data)  # the knob and its budgets
            else:
                resolve_knob(settings.knob, data)
        except KnobError as e:  # counted in energy_router_knob_refusals_total{field}; logged once a minute per field
            self._refused(
                e.field,
                "energy-router: refused a request knob with HTTP 400: %s (more refusals of this field "
                "in the next minute: energy_router_knob_refusals_total only)",
                str(e).removeprefix("energy-router: "),
            )
            raise
        return None

    async def async_post_call_response_headers_hook(
        self,
        data: dict,
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict | None = None,
        litellm_call_info: dict | None = None,
    ) -> dict[str, str] | None:
        """Proxy (LiteLLM >= 1.81, where this hook exists; streaming too): the request's decision-time
        figures as ``x-energy-router-*`` response headers (:func:`~.figures.headers`); ``None`` when the
        router did not route it. Only this process's own record of the decision is read."""
        try:
            decision = HEADERS_BOOK.get(data, take=True)
            return headers(decision.figures) if decision is not None else None
        except Exception:  # noqa: BLE001 - a header must never fail the response
            return None


__all__ = [
    "EnergyRouterCore",
    "EnergyRoutingStrategy",
    "EnergyRouterFilter",
    "KnobError",
    "attach",
    "strip_caller_decision",
]
