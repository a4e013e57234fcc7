"""Per-request energy and carbon figures at decision time, and where LiteLLM users see them.

For a routed request (the router decided, no fallback), :meth:`Accounting.estimate` gives:

* ``joules_estimate`` — the router's estimate Ê of the chosen candidate for this prompt, J;
* ``reference`` / ``joules_reference_estimate`` — the reference candidate (``accounting.reference``, default
  the pool's most energy-hungry candidate for this prompt) and its Ê, J;
* ``joules_saved_estimate`` — their difference, J (negative when the choice costs more than the reference);
* ``site`` and ``co2e_grams_estimate`` — the deployment's site and Ê x PUE x grid intensity there now, g.

They travel on the :class:`~.decision.Decision` (``figures``) to the proxy's response headers
(:func:`headers`, ``x-energy-router-*``), to LiteLLM's standard logging payload (``metadata.energy_router``)
and to the table row. Measured joules settle after the response has left, so they reach the row, the ledger
and the Prometheus counters, never a header. Kept free of LiteLLM imports.
"""

from __future__ import annotations

import time
from typing import Any, Collection, Mapping

from litellm_energy_router.energy.carbon import CarbonModel
from litellm_energy_router.litellm_glue.decision import Decision

HEADER_PREFIX = "x-energy-router-"
SLO_KEY = "energy_router"  # key of the figures in the standard logging payload's metadata
_HEADER_FIELDS = {
    "joules_estimate": "joules-estimate",
    "co2e_grams_estimate": "co2e-grams-estimate",
    "joules_saved_estimate": "joules-saved-estimate",
    "joules_reference_estimate": "joules-reference-estimate",
    "reference": "reference",
    "site": "site",
}


class Accounting:
    """Decision-time figures from the settings' ``accounting`` and ``carbon`` sections."""

    def __init__(self, settings: Any, carbon: CarbonModel | None = None) -> None:
        self.reference = settings.accounting.reference
        self.carbon = carbon or CarbonModel(settings.carbon)

    def reference_of(self, energy_j: Mapping[str, float], pool: Collection[str] | None = None) -> str | None:
        """The configured reference when the router estimated it, else the most energy-hungry candidate of the
        request's ``pool`` (the candidates its model group deploys; all those estimated when not given)."""
        if self.reference is not None and self.reference in energy_j:
            return self.reference
        among = [c for c in energy_j if c in pool] if pool is not None else list(energy_j)
        return max(among, key=lambda c: energy_j[c]) if among else None

    def estimate(
        self,
        decision: Decision | None,
        deployment: Mapping[str, Any] | None,
        t_s: float | None = None,
        pool: Collection[str] | None = None,
    ) -> dict[str, Any] | None:
        """The figures of a routed request (see the module docstring), or ``None`` when not routed; ``pool``: the
        candidates the request's model group deploys (the default reference is the hungriest of them)."""
        if decision is None or decision.fallback is not None or not decision.candidate:
            return None
        e = decision.energy_j
        j = e.get(decision.candidate)
        ref = self.reference_of(e, pool)
        ref_j = e.get(ref) if ref is not None else None
        site = self.carbon.site_of((deployment or {}).get("model_info"))
        t = time.time() if t_s is None else t_s
        return {
            "joules_estimate": j,
            "reference": ref,
            "joules_reference_estimate": ref_j,
            "joules_saved_estimate": round(ref_j - j, 3) if j is not None and ref_j is not None else None,
            "site": site,
            "co2e_grams_estimate": _round(self.carbon.grams(j, site, t)),
        }


def carbon_factors(
    carbon: CarbonModel, candidates: list[str], by_cand: Mapping[str, list[Mapping[str, Any]]], t_s: float
) -> tuple[list[float], dict[str, Mapping[str, Any]]]:
    """(carbon factor per candidate, its cleanest deployment) for the objective ``carbon``: the lowest
    :meth:`~.energy.carbon.CarbonModel.factor` among each candidate's deployments now; a candidate none of
    whose sites has a known intensity weighs 1.0 (the reference intensity) and keeps LiteLLM's spread."""
    out, cleanest = [], {}
    memo: dict[str | None, float | None] = {}
    for c in candidates:
        best, best_f = None, None
        for d in by_cand.get(c, ()):
            site = carbon.site_of(d.get("model_info"))
            f = memo[site] if site in memo else memo.setdefault(site, carbon.factor(site, t_s))
            if f is not None and (best_f is None or f < best_f):
                best, best_f = d, f
        out.append(1.0 if best_f is None else best_f)
        if best is not None:
            cleanest[c] = best
    return out, cleanest


def _round(v: float | None) -> float | None:
    return None if v is None else float(f"{v:.6g}")


def headers(figures: Mapping[str, Any] | None) -> dict[str, str] | None:
    """``x-energy-router-*`` response headers of a request's figures (``None`` when there are none)."""
    if not figures:
        return None
    out = {HEADER_PREFIX + h: _text(figures.get(k)) for k, h in _HEADER_FIELDS.items() if figures.get(k) is not None}
    return out or None


def _text(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "".join(ch for ch in str(v)[:100] if 0x20 < ord(ch) < 0x7F)  # a header value: printable ASCII only


def add_to_logging_payload(kwargs: Mapping[str, Any], decision: Decision | None) -> None:
    """Put the figures into ``kwargs["standard_logging_object"]["metadata"]["energy_router"]`` (what every
    LiteLLM logging integration receives), when there are figures and a payload."""
    slo = kwargs.get("standard_logging_object")
    md = slo.get("metadata") if isinstance(slo, dict) else None
    if not isinstance(md, dict) or decision is None or not decision.figures:
        return
    md[SLO_KEY] = {**decision.figures, "candidate": decision.candidate, "router_version": decision.router_version}
