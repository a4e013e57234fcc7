"""Turn a LiteLLM callback's ``kwargs`` into a :class:`PendingRow` (pure, cheap: runs on the serving
event loop).

Field sources (LiteLLM 1.110, verified against the installed package): ``kwargs["standard_logging_object"]``
carries ``litellm_call_id``, ``id`` (the backend's response id), ``model_id`` (the deployment's
``model_info.id``), ``model`` (e.g. ``openai/small``), ``prompt_tokens``, ``completion_tokens``,
``startTime``/``endTime``/``completionStartTime`` (Unix s), ``messages`` and ``status``. The router's
decision is passed in by the callback, which takes it from this process's record
(:func:`~litellm_energy_router.litellm_glue.decision.take_decision`), never from the request metadata.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from litellm_energy_router.energy.carbon import SITE_KEY
from litellm_energy_router.litellm_glue.decision import Decision
from litellm_energy_router.litellm_glue.deployments import CANDIDATE_KEY, CandidateMap
from litellm_energy_router.litellm_glue.request_text import query_text as routed_text


@dataclass(slots=True)
class PendingRow:
    """One served request, before its energy is known. Times are Unix seconds."""

    call_id: str
    candidate: str
    status: str  # "success" | "failure"
    text: str
    start_s: float
    end_s: float
    first_token_s: float | None
    prompt_tokens: int
    completion_tokens: int
    propensity: float | None
    deployment_id: str | None
    backend_id: str | None
    router_version: str | None = None
    submitted_s: float = 0.0
    # accounting (docs/accounting.md): the authenticated key's attribution, the deployment's site, the
    # router's decision-time estimates (J)
    key_hash: str | None = None
    key_alias: str | None = None
    team: str | None = None
    team_alias: str | None = None
    user_id: str | None = None
    model_group: str | None = None
    site: str | None = None
    estimate_j: float | None = None
    reference_j: float | None = None
    # the online state (router/adapt.py): the request's context keys, and the checkpoint's estimate (J) of the
    # served candidate before the online correction
    context: str | None = None
    checkpoint_j: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}  # type: ignore[attr-defined]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "PendingRow":
        return cls(**{f: d.get(f) for f in cls.__slots__})  # type: ignore[attr-defined]


def query_text(kwargs: Mapping[str, Any], slo: Mapping[str, Any]) -> str:
    """The query as stored in the table: the same text the router routes on
    (:func:`litellm_energy_router.litellm_glue.request_text.query_text`: the last user turn with a little
    context; a text-completion prompt or embedding input when there are no messages)."""
    messages = slo.get("messages") or kwargs.get("messages")
    if isinstance(messages, str):
        return messages
    text = routed_text(
        messages if isinstance(messages, (list, tuple)) else None,
        prompt=kwargs.get("prompt"),
        input=kwargs.get("input"),
        route_prompts=True,
    )
    return text or ""


def _ts(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, datetime):
        return v.timestamp()
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _int(v: Any) -> int:
    try:
        return max(int(v or 0), 0)
    except (TypeError, ValueError):
        return 0


def extract_row(
    kwargs: Mapping[str, Any],
    start_time: Any,
    end_time: Any,
    status: str,
    cmap: CandidateMap,
    decision: Decision | None = None,
) -> PendingRow | None:
    """Build the pending row of one LiteLLM event; ``None`` when no deployment served it (nothing to
    attribute: e.g. "no deployments available"). ``decision``: what this process's router decided for
    the request, if anything."""
    slo = kwargs.get("standard_logging_object") or {}
    lp = kwargs.get("litellm_params") or {}
    md = lp.get("metadata") or {}
    call_id = slo.get("litellm_call_id") or kwargs.get("litellm_call_id")
    if not call_id:
        return None
    info = md.get("model_info") or lp.get("model_info") or {}
    info = info if isinstance(info, Mapping) else {}
    model_id = slo.get("model_id") or info.get("id")
    tagged = info.get(CANDIDATE_KEY)
    model = slo.get("model") or md.get("deployment") or kwargs.get("model")
    chosen = decision.candidate if decision else None
    candidate = cmap.resolve(
        model_id, model, chosen, decision.deployment_id if decision else None, str(tagged) if tagged else None
    )
    if not candidate or (not model_id and status == "failure" and not decision):
        return None
    start = _ts(slo.get("startTime")) or _ts(start_time) or time.time()
    end = _ts(slo.get("endTime")) or _ts(end_time) or start
    first = _ts(slo.get("completionStartTime"))
    if first is not None and not (start <= first <= end):
        first = None
    propensity = decision.propensity if decision and decision.candidate == candidate else None
    if propensity is not None and not (0.0 < propensity <= 1.0):
        propensity = None
    version = _router_version(decision, candidate)
    figures = (decision.figures or {}) if version is not None and decision is not None else {}
    group = slo.get("model_group") or md.get("model_group")
    return PendingRow(
        call_id=str(call_id),
        candidate=str(candidate),
        status="success" if status == "success" else "failure",
        text=query_text(kwargs, slo),
        start_s=start,
        end_s=max(end, start),
        first_token_s=first,
        prompt_tokens=_int(slo.get("prompt_tokens")),
        completion_tokens=_int(slo.get("completion_tokens")),
        propensity=propensity,
        deployment_id=str(model_id) if model_id else None,
        backend_id=str(slo["id"]) if slo.get("id") else None,
        router_version=version,
        **attribution(slo),
        model_group=str(group)[:200] if group else None,
        site=str(info[SITE_KEY])[:100] if info.get(SITE_KEY) else None,
        estimate_j=_num(figures.get("joules_estimate")),
        reference_j=_num(figures.get("joules_reference_estimate")),
        **_adapt_fields(decision, candidate),
    )


def _adapt_fields(decision: Decision | None, candidate: str) -> dict[str, Any]:
    """The request's context and the checkpoint's estimate for ``candidate`` (J), from this process's decision,
    never from request metadata."""
    if decision is None or decision.fallback is not None or not decision.adapt:
        return {}
    ctx = decision.adapt.get("context")
    return {
        "context": str(ctx)[:64] if ctx else None,
        "checkpoint_j": _num((decision.adapt.get("checkpoint_j") or {}).get(candidate)),
    }


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and v >= 0 else None


# PendingRow field -> standard logging payload metadata key (set by the proxy from the authenticated key)
ATTRIBUTION = {
    "key_hash": "user_api_key_hash",
    "key_alias": "user_api_key_alias",
    "team": "user_api_key_team_id",
    "team_alias": "user_api_key_team_alias",
    "user_id": "user_api_key_user_id",
}


def attribution(slo: Mapping[str, Any]) -> dict[str, str | None]:
    """The authenticated key's hash, alias, team id and alias, and user id from a standard logging payload."""
    md = slo.get("metadata") if isinstance(slo, Mapping) else None
    md = md if isinstance(md, Mapping) else {}
    out: dict[str, str | None] = {}
    for field, key in ATTRIBUTION.items():
        v = md.get(key)
        out[field] = str(v)[:200] if v not in (None, "") else None
    return out


def _router_version(decision: Decision | None, candidate: str) -> str | None:
    """The checkpoint version whose policy chose the served candidate: only from this process's own
    decision, only when the router decided (no fallback) and the served candidate is its choice."""
    if decision is None or decision.fallback is not None or decision.candidate != candidate:
        return None
    v = decision.router_version
    return v[:100] if isinstance(v, str) and v else None
