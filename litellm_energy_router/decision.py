"""What the router decided for one request, as it travels in LiteLLM request metadata.

The routing strategy stores ``Decision.as_metadata()`` under ``metadata[DECISION_KEY]`` of the
request; the energy callback reads it back with :func:`decision_from_kwargs` and writes the chosen
candidate, its propensity and the router version into the table. Kept free of LiteLLM and torch
imports so any layer may use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

DECISION_KEY = "energy_router_decision"
KNOB_KEY = "energy_router"  # request metadata: {"energy_router": {"lambda": 0.3}} or {"target_accuracy": 0.9}


@dataclass
class Decision:
    """One routing decision.

    Attributes:
        candidate: chosen candidate name (table key).
        deployment_id: LiteLLM ``model_info.id`` of the chosen deployment, when known.
        scores: predicted probability of a correct answer per candidate, in [0, 1].
        energy_j: estimated joules per candidate for this prompt (J).
        lambda_: energy weight used (accuracy given up per ``knob.e_ref_j`` joules), or None.
        target_accuracy: accuracy target used, or None.
        max_energy_j: energy budget per request used (J, estimated), or None.
        propensity: probability that this policy picks ``candidate`` for this request, in (0, 1].
        router_version: checkpoint version that decided.
        fallback: why the router did not decide (``None`` when it did): e.g. "timeout", "error".
        latency_ms: decision time, milliseconds.
    """

    candidate: str | None
    deployment_id: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    energy_j: dict[str, float] = field(default_factory=dict)
    lambda_: float | None = None
    target_accuracy: float | None = None
    max_energy_j: float | None = None
    propensity: float | None = None
    router_version: str | None = None
    fallback: str | None = None
    latency_ms: float | None = None

    def as_metadata(self) -> dict[str, Any]:
        """A plain dict (what ``dataclasses.asdict`` gives, without its recursive deep copy: this runs
        on every routed request)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["scores"], d["energy_j"] = dict(self.scores), dict(self.energy_j)
        return d

    @classmethod
    def from_metadata(cls, d: Mapping[str, Any]) -> "Decision":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


def decision_from_kwargs(kwargs: Mapping[str, Any]) -> Decision | None:
    """Find the decision in a LiteLLM callback's ``kwargs`` (``litellm_params.metadata`` or the
    standard logging object's metadata); ``None`` when the request was not routed by us."""
    candidates: list[Any] = []
    lp = kwargs.get("litellm_params") or {}
    candidates.append((lp.get("metadata") or {}) if isinstance(lp, Mapping) else {})
    candidates.append(kwargs.get("metadata") or {})
    slo = kwargs.get("standard_logging_object") or {}
    if isinstance(slo, Mapping):
        candidates.append(slo.get("metadata") or {})
    for md in candidates:
        if isinstance(md, Mapping) and isinstance(md.get(DECISION_KEY), Mapping):
            return Decision.from_metadata(md[DECISION_KEY])
    return None
