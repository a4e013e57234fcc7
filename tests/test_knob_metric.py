"""Refused request knobs are counted per field, with bounded label values."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from litellm_energy_router.knob import KnobError, resolve_knob
from litellm_energy_router.settings import KnobSettings


def _count(field: str) -> float:
    return REGISTRY.get_sample_value("energy_router_knob_refusals_total", {"field": field}) or 0.0


@pytest.mark.parametrize(
    "meta, field",
    [
        ({"energy_router": {"lambda": -5}}, "lambda"),
        ({"energy_router": {"target_accuracy": "high"}}, "target_accuracy"),
        ({"energy_router": "cheap"}, "energy_router"),
        ({"energy_router": {"lambda_typo_<script>": 1}}, "other"),
    ],
)
def test_each_refusal_is_counted_once_by_field(meta, field):
    before = {f: _count(f) for f in ("lambda", "target_accuracy", "max_energy_j", "energy_router", "other")}
    with pytest.raises(KnobError):
        resolve_knob(KnobSettings(), {"metadata": meta})
    after = {f: _count(f) for f in before}
    assert after[field] == before[field] + 1
    assert all(after[f] == before[f] for f in before if f != field)
    resolve_knob(KnobSettings(), {"metadata": {"energy_router": {"lambda": 0.2}}})  # accepted: not counted
    assert _count(field) == after[field]
