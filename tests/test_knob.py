"""The knob is defined once (`Knob`): the settings sections, the request parser, the policy ranges and the
docs table are derived from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from litellm_energy_router import knob as K
from litellm_energy_router.settings import Settings, load_settings

DOCS = Path(__file__).resolve().parents[1] / "docs" / "serving.md"


def test_docs_table_is_the_generated_one():
    text = DOCS.read_text()
    got = re.search(r"<!-- knob-table:start -->\n(.*?)\n<!-- knob-table:end -->", text, re.S)
    assert got is not None and got.group(1) == K.knob_table(), "regenerate with: python -m litellm_energy_router.knob"


def test_settings_parser_and_policy_follow_the_knob_fields():
    fields = set(K.Knob.model_fields)
    assert fields <= set(K.KnobSettings.model_fields)
    assert set(K.KEY_SCOPED) <= set(K.KnobOverride.model_fields)
    assert "e_ref_j" not in K.KnobOverride.model_fields  # a global-only field
    assert set(K.REQUEST_FIELDS) == {"lambda", "target_accuracy", "max_energy_j", "objective"}
    assert set(K.RANGES.values()) == set(K.RANGE_LIMITS) <= set(K.KnobPolicy.model_fields)
    # the bounds of a settings value and of a policy range are the field's own
    bad_values = (
        {"lambda": 1001},
        {"target_accuracy": 1.5},
        {"max_energy_j": 0},
        {"e_ref_j": -1},
        {"objective": "watts"},
    )
    for bad in bad_values:
        with pytest.raises(ValidationError):
            K.Knob(**bad)
        with pytest.raises(ValidationError):
            K.KnobSettings(**bad)
    with pytest.raises(ValidationError, match="lo <= hi <= 1000"):
        K.KnobPolicy(lambda_range=(0, 2000))
    with pytest.raises(ValidationError, match="0 < lo"):
        K.KnobPolicy(max_energy_j_range=(0, 10))


def test_knob_is_frozen_and_resolved_from_settings(tmp_path):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("energy_router:\n  knob: {lambda: 0.2, e_ref_j: 50, per_key: {eco: {max_energy_j: 30}}}\n")
    s = load_settings(cfg, environ={})
    k = K.resolve_knob(s.knob, {"metadata": {"user_api_key_alias": "eco", "energy_router": {"target_accuracy": 0.8}}})
    assert k == K.Knob(**{"lambda": 0.2}, target_accuracy=0.8, max_energy_j=30.0, e_ref_j=50.0)
    with pytest.raises(ValidationError):
        k.lambda_ = 1.0  # type: ignore[misc]
    assert K.resolve_knob(Settings().knob, None) == K.Knob()
