"""The GRPO choice policy's files (a training artefact; never served).

A checkpoint trained with the GRPO stage (:mod:`litellm_energy_router.training.grpo`, off by default)
stores the λ-conditioned choice policy beside the scorer and records in ``knob.grpo`` its never-worse
check per λ bucket (the policy's mean utility minus the scorer's decision's, with standard errors, and
``served``: whether it beat the decision rule beyond the spread). Serving, ``energy-router route``,
off-policy evaluation and evaluation decide with the one rule (:func:`.decide.decide`) on the scorer's
P and Ê only, whatever that check says: no entry point runs the policy, so no request is decided by
another rule. ``benchmarks/grpo_vs_sft.py`` judges the policy against that rule.
"""

from __future__ import annotations

POLICY_FILE = "policy.safetensors"  # the GRPO policy's weights (architecture and tokenizer: the checkpoint's)
START_FILE = "policy_start.safetensors"  # its SFT start (saved only for benchmarks)
