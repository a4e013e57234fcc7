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

import logging
import random
from typing import Any, Mapping

from litellm.integrations.custom_logger import CustomLogger
from litellm.types.router import CustomRoutingStrategyBase

from litellm_energy_router.budgets import BudgetBook
from litellm_energy_router.errors import REFUSAL_LINES
from litellm_energy_router.knob import KNOB_KEY, REQUEST_FIELDS, KnobError, metadata_dicts, resolve_knob
from litellm_energy_router.litellm_glue import litellm_compat
from litellm_energy_router.litellm_glue.core import CALLER_ERRORS, EnergyRouterCore
from litellm_energy_router.litellm_glue.decision import (
    DECISION_BOOK,
    DECISION_KEY,
    Decision,
    DecisionBook,
)
from litellm_energy_router.litellm_glue.figures import (
    headers,
)
from litellm_energy_router.metrics import (
    FALLBACKS,
    RateLimitedWarning,
)
from litellm_energy_router.settings import Settings, load_settings

log = logging.getLogger("litellm_energy_router")
HEADERS_BOOK = DecisionBook(name="headers")  # proxy decisions whose figures the response-headers hook has not sent yet


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
        self._idle_book: BudgetBook | None = None  # the hard budgets' check while the core is not built (never read)

    @property
    def _headers(self) -> bool:
        """Whether a decision is kept for its response headers: they are on, and this LiteLLM sends them (1.80.x
        never reads them back: every routed request's decision would be kept until evicted)."""
        return self.core.settings.accounting.headers and litellm_compat.sends_response_headers()

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
        mds = metadata_dicts(request_kwargs)
        try:
            dep, decision = await self.core.choose(healthy_deployments, messages, None, request_kwargs)
            attach(request_kwargs, decision)
            if mds and decision is not None and decision.figures and self._headers:
                HEADERS_BOOK.put(mds[0], decision)
            elif mds:  # a retry or fallback this router did not route: no earlier attempt's figures in its headers
                HEADERS_BOOK.discard(mds[0])
        except CALLER_ERRORS:
            raise  # a caller error: the router raises it as is (status_code 400 or 429)
        except Exception as e:  # noqa: BLE001 - e.g. a bad config: never fail the request
            FALLBACKS.labels(reason="error").inc()
            log.warning("energy-router: filter error %s", e)
            return healthy_deployments
        return [dep] if dep is not None else healthy_deployments

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> None:
        """Proxy, before routing and before any backend call: drop a caller-sent decision and refuse an
        invalid request knob (:class:`~.knob.KnobError`; the proxy answers HTTP 400 naming the field) and a request
        over a hard budget (:class:`~.budgets.BudgetExceeded`, HTTP 429; while the router has not started, every
        request of a hard budget: its spend is unknown, so it fails closed)."""
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
                knob = resolve_knob(settings.knob, data)
                b = settings.budgets
                if any(x.mode == "hard" for x in (*b.keys.values(), *b.teams.values())):
                    if self._idle_book is None or self._idle_book.cfg is not b:
                        self._idle_book = BudgetBook(b, settings.table.url)  # never started: no spend read
                    self._idle_book.apply(knob, self._idle_book.match(metadata_dicts(data)))
        except KnobError as e:  # counted in energy_router_knob_refusals_total{field}; logged once a minute per field
            self._refused(
                e.field if e.field in (*REQUEST_FIELDS, KNOB_KEY) else "other",  # a caller-chosen name: one key
                "energy-router: refused a request knob with HTTP 400: %s (more refusals of this field "
                "in the next minute: energy_router_knob_refusals_total only)",
                str(e).removeprefix("energy-router: "),
            )
            REFUSAL_LINES.note(e)  # the proxy's ERROR line about it is dropped (litellm_compat.quiet_refusals)
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
