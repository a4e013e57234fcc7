"""When the GRPO choice policy may decide instead of the scorer's decision rule (numpy only).

A checkpoint trained with the GRPO stage (:mod:`litellm_energy_router.training.grpo`) records in
``knob.grpo`` the policy's weights file and, per λ bucket, the check made on its calibration queries
(queries neither the policy's SFT start nor GRPO trained on): the policy's mean utility
``correct − λ·joules/e_ref`` minus the scorer's decision's and minus its start's, with standard errors,
and ``served`` (true only when the policy beats the scorer's decision beyond the spread and is not
below its start beyond it).

:func:`served_bucket` gives the bucket whose policy may choose for a request's knob, or ``None``: then
the calibrated scorer's decision (:func:`.decide.decide`) chooses, as for every checkpoint without a
served bucket. Only the exact bucket λ qualifies (the check measured nothing between buckets); a
target accuracy or an energy budget always goes to the decision rule. The policy is an LM: only the
``lm`` scorer (:meth:`.model.RouterModel.choose`) runs it; the student and every numpy scorer keep the
decision rule, so the lean serving path never imports torch for it.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .decide import DEFAULT_E_REF_J

POLICY_FILE = "policy.safetensors"  # the GRPO policy's weights (architecture and tokenizer: the checkpoint's)
START_FILE = "policy_start.safetensors"  # its SFT start (saved only for benchmarks)


def served_bucket(knob: Mapping[str, Any] | None, lam: float | None, target: float | None = None,
                  e_ref_j: float = DEFAULT_E_REF_J, max_energy_j: float | None = None) -> int | None:  # fmt: skip
    """Index of the bucket whose policy decides a request with this knob, or None (the scorer decides)."""
    g = (knob or {}).get("grpo") or {}
    if lam is None or target is not None or max_energy_j is not None or not g.get("file"):
        return None
    if not math.isclose(float(g.get("e_ref_j", math.nan)), float(e_ref_j)):
        return None  # λ measured in another energy unit
    for b, entry in enumerate(g.get("buckets") or []):
        if entry.get("served") is True and math.isclose(float(entry["lambda"]), float(lam), rel_tol=1e-6, abs_tol=1e-12):
            return b
    return None
