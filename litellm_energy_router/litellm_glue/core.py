"""The routing core shared by the SDK strategy, the proxy filter and the benchmarks: request → knob (budgets
included) → text and context → score → one decision (:func:`~litellm_energy_router.router.decide.decide`) →
exploration → deployment, failing open (docs/serving.md). The LiteLLM classes around it are in :mod:`.strategy`.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import random
import time
from contextlib import contextmanager
from typing import Any, Collection, Iterator, Mapping, Sequence

import numpy as np

from litellm_energy_router.budgets import CHEAPEST_LAMBDA, BudgetBook, BudgetExceeded
from litellm_energy_router.knob import Knob, KnobError, metadata_dicts, resolve_knob
from litellm_energy_router.litellm_glue.decision import (
    Decision,
)
from litellm_energy_router.litellm_glue.deployments import CandidateMap, deployment_keys
from litellm_energy_router.litellm_glue.figures import (
    Accounting,
    carbon_factors,
)
from litellm_energy_router.litellm_glue.request_text import query_text, request_chars
from litellm_energy_router.metrics import (
    DECISION_SECONDS,
    DECISIONS,
    FALLBACKS,
    RateLimitedWarning,
)
from litellm_energy_router.router.adapt import ADAPT, start_refresh
from litellm_energy_router.router.context import Context
from litellm_energy_router.router.decide import decide
from litellm_energy_router.router.online import context_epsilon, explore_pick, explore_within
from litellm_energy_router.router.output_tokens import (
    bounded_energy,
    bounded_note,
    context_bounded_energy,
    request_max_tokens,
)
from litellm_energy_router.router.runtime import (
    NoCheckpoint,
    RouterLoading,
    RouterRuntime,
    Scored,
)
from litellm_energy_router.settings import Settings, load_settings

log = logging.getLogger("litellm_energy_router")
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
        self._memo: dict[tuple, str | None] = {}  # (deployment keys, checkpoint version) → candidate: pool()
        self._counted: dict[str, Any] = {}  # candidate → its decisions counter (prometheus' labels() per request)
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
    def knob(self, request_kwargs: Mapping[str, Any] | None, states: list | None = None) -> Knob:
        """The request's :class:`~.knob.Knob`: request metadata beats the per-key default, which beats
        the global one; λ raised by its budgets' multipliers (``states``: :meth:`budget_states`, when the caller
        matched them). Raises :class:`~.knob.KnobError` for a request value ``knob.policy`` refuses,
        :class:`~.budgets.BudgetExceeded` over a hard budget that refuses."""
        knob = resolve_knob(self.settings.knob, request_kwargs)
        if self.budgets is None:
            return knob
        return self.budgets.apply(knob, self.budget_states(request_kwargs) if states is None else states)

    def budget_states(self, request_kwargs: Mapping[str, Any] | None) -> list:
        """The budgets the request's authenticated key and team match (:meth:`.BudgetBook.match`), matched once per
        request: its knob, its hold while scored and its charge all count against the same ones."""
        return self.budgets.match(metadata_dicts(request_kwargs)) if self.budgets is not None else []

    def _known(self) -> set[str]:
        model = self.runtime.model
        return self._cmap.names or (set(model.candidates) if model is not None else set())

    def candidate_of(self, deployment: Mapping[str, Any] | None, known: set[str] | None = None) -> str | None:
        """The candidate a deployment serves, or ``None`` when it is not one of the router's (with no
        candidate known yet, e.g. while the checkpoint loads: its id or model string). ``known``: :meth:`_known`."""
        return self._candidate_by_keys(deployment_keys(deployment), known)

    def _candidate_by_keys(self, keys: tuple[str | None, str | None, str | None], known: set[str] | None) -> str | None:
        """:meth:`candidate_of` from the deployment's :func:`.deployments.deployment_keys`."""
        dep_id, model, tag = keys
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
        memo, version, known = self._memo, self.runtime.version, None
        if len(memo) > 4096:  # deployments come and go with the proxy's config: bounded
            memo.clear()
        for d in deployments:
            keys = deployment_keys(d)
            if (keys, version) in memo:
                c = memo[keys, version]
            else:
                known = self._known() if known is None else known
                c = memo[keys, version] = self._candidate_by_keys(keys, known)
                self._warn_unknown_tag(keys, c)
            if c is not None:
                by_cand.setdefault(c, []).append(d)
        return by_cand

    def _warn_unknown_tag(self, keys: tuple[str | None, str | None, str | None], cand: str | None) -> None:
        """A deployment tagged ``energy_router_candidate`` with a name the checkpoint does not score (a typo) is never
        routed to: said once per deployment and checkpoint version (it was silent), with the closest name."""
        model = self.runtime.model
        if cand is None or keys[2] is None or model is None or cand in model.candidates:
            return
        close = difflib.get_close_matches(cand, list(model.candidates), n=1)
        log.warning(
            "energy-router: deployment %s: model_info.energy_router_candidate %r is not a candidate of the router "
            "(%s): the router never sends requests to it",
            keys[0] or keys[1],
            cand[:200],
            f"did you mean {close[0]!r}?" if close else f"candidates: {', '.join(model.candidates)}",
        )

    def context_lengths(
        self, candidates: Sequence[str], by_cand: Mapping[str, Sequence[Mapping[str, Any]]]
    ) -> np.ndarray | None:
        """Context length (tokens, prompt + output; inf: none known) per candidate, or None when no candidate has
        one: the largest ``model_info.max_input_tokens`` of its deployments in the pool, else its
        ``candidates[].context_tokens`` setting."""
        found = dict(self._context)  # one pass over the pool's deployments; a deployment's figure beats the setting
        for c, deps in by_cand.items():
            vals = [v for d in deps if type(v := (d.get("model_info") or {}).get("max_input_tokens")) is int and v > 0]
            if vals:
                found[c] = max(vals)
        out = [float(found.get(c) or np.inf) for c in candidates] if found else ()
        return np.array(out) if any(n < np.inf for n in out) else None

    def decide(
        self,
        scored: Scored,
        deployments: Sequence[Mapping[str, Any]],
        knob: Knob,
        t0: float,
        by_cand: dict[str, list[Mapping[str, Any]]] | None = None,
        request_kwargs: Mapping[str, Any] | None = None,
        ctx: Context | None = None,
        prompt_scale: float = 1.0,
    ) -> tuple[Any, Decision]:
        """(deployment, decision): :func:`~.router.decide.decide` over the candidates in the pool
        (``by_cand``: :meth:`pool`, when the caller mapped it already), on P and Ê adapted to the request's
        context ``ctx`` (:mod:`.router.adapt`), Ê bounded by its ``max_tokens``, then ε-exploration
        (``router.epsilon``, higher in a new context with ``router.epsilon_new_context``; spread by energy
        uncertainty) and a deployment of the chosen candidate. ``prompt_scale``: the whole prompt's size over the
        routed text's (:meth:`_plan`): Ê's prompt part and the context-length check count the whole prompt."""
        by_cand = self.pool(deployments) if by_cand is None else by_cand
        avail = [j for j, c in enumerate(scored.candidates) if c in by_cand]
        if not avail:
            return self._fallback(
                deployments, "no_candidate", f"pool {sorted(by_cand)} vs router {list(scored.candidates)}"
            )
        self.adapt.bind(self.runtime.model)
        rs = self.settings.router
        max_tokens = request_max_tokens(request_kwargs)
        ctx_len = self.context_lengths(scored.candidates, by_cand)
        E0, pt = scored.E, scored.prompt_tokens
        if prompt_scale > 1.0 and pt is not None and scored.j_prompt is not None:  # the turns the text left out
            E0, pt = E0 + (prompt_scale - 1.0) * pt * np.asarray(scored.j_prompt), pt * prompt_scale
        E_all = context_bounded_energy(
            bounded_energy(E0, scored.tokens, scored.j_out, max_tokens),
            scored.tokens,
            pt,
            scored.j_prompt,
            scored.j_out,
            max_tokens,
            ctx_len,
        )
        P_all, E_all, explore, adapt = self.adapt.apply(
            scored, ctx, E_all, max(rs.epsilon, rs.epsilon_new_context) > 0, rs.context_rows
        )
        P, E = P_all[avail][None, :], E_all[avail][None, :]
        factors, cleanest = None, {}
        if knob.objective == "carbon" and self.accounting.carbon.enabled:
            names = [scored.candidates[j] for j in avail]
            factors, cleanest = carbon_factors(self.accounting.carbon, names, by_cand, time.time())
        j_best = int(decide(P, E, knob, factors)[0])
        rows = (adapt or {}).get("context_production_rows")  # None: no online state, so no "new context" either
        eps = rs.epsilon if rows is None else context_epsilon(rs.epsilon, rs.epsilon_new_context, rows)
        weights = None
        if explore is not None and eps > 0:
            aim = (lambda p, e: decide(p, e, knob, factors)) if rs.explore == "aimed" else None
            weights = explore.weights(avail, P[0], E[0], j_best, aim)
        eps, weights = explore_within(eps, weights, E[0], knob.max_energy_j, knob.lambda_ >= CHEAPEST_LAMBDA)
        j, propensity = explore_pick(self._rng, eps, j_best, weights, len(avail))
        cand = scored.candidates[avail[j]]
        dep = cleanest.get(cand) or self._rng.choice(by_cand[cand])
        dt = time.perf_counter() - t0
        counter = self._counted.get(cand) or self._counted.setdefault(cand, DECISIONS.labels(candidate=cand))
        counter.inc()
        DECISION_SECONDS.observe(dt)
        note = bounded_note(scored.note, scored.candidates, max_tokens, pt, ctx_len)
        return dep, _decision(scored, cand, dep, P_all, E_all, note, knob, propensity, dt, adapt)

    def _plan(
        self,
        deployments: Sequence[Mapping[str, Any]],
        messages: Any,
        input: Any,
        request_kwargs: Mapping[str, Any] | None,
        states: list | None = None,
    ) -> tuple[str, Knob, dict[str, list[Mapping[str, Any]]], Context | None, float] | None:
        """(text, knob, deployments by candidate, context, the whole prompt's characters over the text's, ≥ 1) to
        route on, or ``None`` to pass the request through unrouted (a model group that is not the router's pool,
        or no text). The knob is checked first: an invalid one is refused whichever model group the request is
        for."""
        knob = self.knob(request_kwargs, states)
        by_cand = self.pool(deployments)
        if not by_cand:
            return None
        text = query_text(messages, prompt=(request_kwargs or {}).get("prompt"), input=input)
        if text is None:
            return None
        group = next((d.get("model_name") for d in deployments if d.get("model_name")), None)
        ctx = self.adapt.context(text, request_kwargs, messages, group) if self.settings.router.online else None
        whole = request_chars(messages) if messages else 0
        return text, knob, by_cand, ctx, (whole / len(text) if text and whole > len(text) else 1.0)

    def _account(
        self,
        states: list,
        dep: Any,
        decision: Decision | None,
        pool: Collection[str] | None = None,
    ) -> tuple[Any, Decision | None]:
        """Attach the decision-time energy and carbon figures (:mod:`.figures`; ``pool``: the candidates the request's
        model group deploys) and charge them to the request's budgets' local spend; never fails the request."""
        if decision is not None and dep is not None:
            try:
                decision.figures = self.accounting.estimate(decision, dep, pool=pool)
                if self.budgets is not None:
                    self.budgets.charge(states, decision.figures)
            except Exception as e:  # noqa: BLE001 - accounting must not fail routing
                self._warn("figures", "energy-router: no energy figures: %s", e)
        return dep, decision

    @contextmanager
    def _held(self, states: list) -> Iterator[None]:
        """While the request is scored, its budgets count it at their typical charge (:meth:`.BudgetBook.hold`)."""
        book = self.budgets
        held = book.hold(states) if book is not None else []
        try:
            yield
        finally:
            if held:
                book.release(held)  # type: ignore[union-attr]

    def _failed(self, deployments: Sequence[Mapping[str, Any]], e: BaseException, states: list) -> tuple[Any, Decision]:
        """Fail open (LiteLLM's own choice); the request's budgets count it at their typical charge."""
        if self.budgets is not None:
            try:
                self.budgets.charge_unrouted(states)
            except Exception as err:  # noqa: BLE001 - accounting must not fail the request
                self._warn("figures", "energy-router: unrouted request not charged: %s", err)
        if isinstance(e, asyncio.TimeoutError):
            return self._fallback(deployments, "timeout", f"> {self.settings.router.timeout_ms} ms")
        return self._fallback(deployments, _reason(e), str(e).splitlines()[0] if str(e) else type(e).__name__)

    def _decided(
        self,
        scored: Scored,
        deployments: Sequence[Mapping[str, Any]],
        plan: tuple,
        t0: float,
        request_kwargs: Mapping[str, Any] | None,
        limit_s: float,
        states: list,
    ) -> tuple[Any, Decision | None]:
        """The decision on a scored ``plan`` (:meth:`_plan`) with its figures; a score that took longer than
        ``limit_s`` (s, from ``t0``) is a timeout (an in-place score cannot be cut short)."""
        if time.perf_counter() - t0 > limit_s:
            raise asyncio.TimeoutError()
        decided = self.decide(scored, deployments, plan[1], t0, plan[2], request_kwargs, plan[3], plan[4])
        return self._account(states, *decided, pool=plan[2])

    async def choose(
        self,
        deployments: Sequence[Mapping[str, Any]],
        messages: Any = None,
        input: Any = None,
        request_kwargs: Mapping[str, Any] | None = None,
    ) -> tuple[Any, Decision | None]:
        """(deployment or None for LiteLLM's own choice, decision or None when not routed)."""
        t0, states = time.perf_counter(), []
        try:
            states = self.budget_states(request_kwargs)
            plan = self._plan(deployments, messages, input, request_kwargs, states)
            if plan is None:
                return None, None
            budget, rt = self.settings.router.timeout_ms / 1000, self.runtime
            if rt.inline:  # the student scores in place: no task and no loop turns for wait_for to add
                return self._decided(rt.score_sync(plan[0]), deployments, plan, t0, request_kwargs, budget, states)
            with self._held(states):  # seen by the budget checks of requests admitted while it is scored
                scored = await asyncio.wait_for(rt.score(plan[0]), budget)
                return self._decided(scored, deployments, plan, t0, request_kwargs, budget, states)
        except CALLER_ERRORS:
            raise  # the caller's error, not the router's: refused, not failed open
        except Exception as e:  # noqa: BLE001 - fail open, never fail the request
            return self._failed(deployments, e, states)

    def choose_sync(
        self,
        deployments: Sequence[Mapping[str, Any]],
        messages: Any = None,
        input: Any = None,
        request_kwargs: Mapping[str, Any] | None = None,
    ) -> tuple[Any, Decision | None]:
        """Sync twin of :meth:`choose` (LiteLLM's sync calls); the timeout is checked after scoring."""
        t0, states = time.perf_counter(), []
        try:
            states = self.budget_states(request_kwargs)
            plan = self._plan(deployments, messages, input, request_kwargs, states)
            if plan is None:
                return None, None
            with self._held(states):  # LiteLLM's sync calls may come from several threads
                scored = self.runtime.score_sync(plan[0])
                limit_s = self.settings.router.timeout_ms / 1000
                return self._decided(scored, deployments, plan, t0, request_kwargs, limit_s, states)
        except CALLER_ERRORS:
            raise
        except Exception as e:  # noqa: BLE001
            return self._failed(deployments, e, states)


def _decision(
    scored: Scored,
    cand: str,
    dep: Mapping[str, Any],
    P: np.ndarray,
    E: np.ndarray,
    note: dict | None,
    knob: Knob,
    propensity: float,
    dt: float,
    adapt: dict | None,
) -> Decision:
    """The decision's record: P and Ê (J) per candidate as decided on, the knob, the propensity, ``dt`` (s)."""
    names = scored.candidates
    return Decision(
        candidate=cand,
        deployment_id=_dep_id(dep),
        scores=dict(zip(names, np.round(P[: len(names)], 5).tolist())),
        energy_j=dict(zip(names, np.round(E[: len(names)], 3).tolist())),
        energy_note=note,
        lambda_=None if knob.target_accuracy is not None else knob.lambda_,
        target_accuracy=knob.target_accuracy,
        max_energy_j=knob.max_energy_j,
        propensity=round(propensity, 6),
        router_version=scored.version,
        latency_ms=round(dt * 1000, 3),
        adapt=adapt,
    )


def _reason(e: Exception) -> str:
    if isinstance(e, RouterLoading):
        return "loading"
    return "no_checkpoint" if isinstance(e, NoCheckpoint) else "error"


def _dep_id(d: Mapping[str, Any] | None) -> str | None:
    if not d:
        return None
    v = (d.get("model_info") or {}).get("id")
    return str(v) if v is not None else None
