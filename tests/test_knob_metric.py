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


def test_caller_chosen_field_names_are_one_log_key_and_the_limiter_is_bounded(caplog):
    """5,000 refusals with 5,000 different unknown field names: one WARNING line within the minute (the limiter keys
    on the bounded field set, ``other`` for any unknown name), and no limiter grows past its bound."""
    import asyncio
    import logging

    from litellm_energy_router.litellm_glue.strategy import EnergyRouterFilter
    from litellm_energy_router.metrics import RateLimitedWarning
    from litellm_energy_router.settings import Settings

    f = EnergyRouterFilter(Settings())

    async def many():
        for i in range(5000):
            data = {"metadata": {"energy_router": {f"x{i:06d}": 1}}, "messages": [{"role": "user", "content": "hi"}]}
            with pytest.raises(KnobError):
                await f.async_pre_call_hook(None, None, data, "completion")

    with caplog.at_level(logging.WARNING, logger="litellm_energy_router"):
        asyncio.run(many())
    assert len([r for r in caplog.records if "refused a request knob" in r.getMessage()]) == 1
    assert len(f._refused._last) == 1
    lim = RateLimitedWarning(logging.getLogger("t"), 60.0, max_keys=3)
    assert all(lim(f"k{i}", "line %s", i) for i in range(10)) and list(lim._last) == ["k7", "k8", "k9"]
