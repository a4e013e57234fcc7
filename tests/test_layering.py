"""Dependency rules: the serving path never loads TRL or the training package; training and profiling never
load the LiteLLM glue; the table loads nothing above it. Checked in fresh interpreters."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
import {mods}
bad = sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in {forbidden!r}))
print(",".join(bad))
"""


@pytest.mark.parametrize(
    "mods, forbidden",
    [
        ("litellm_energy_router.strategy, litellm_energy_router.proxy_router, litellm_energy_router.callback, "
         "litellm_energy_router.router.runtime, litellm_energy_router.router.model, litellm_energy_router.router.student, "
         "litellm_energy_router.router.fastpath",
         ["trl", "litellm_energy_router.training"]),
        ("litellm_energy_router.training.pipeline, litellm_energy_router.training.crossval, "
         "litellm_energy_router.profiling.runner",
         ["litellm_energy_router.strategy", "litellm_energy_router.proxy_router", "litellm_energy_router.callback"]),
        # the demo sits above serving and training: it imports training only inside functions
        ("litellm_energy_router.demo.loop, litellm_energy_router.demo.serve, litellm_energy_router.demo.compare, "
         "litellm_energy_router.demo.backend, litellm_energy_router.demo.task_answers, litellm_energy_router.cli",
         ["trl", "litellm_energy_router.training"]),
        ("litellm_energy_router.table",
         ["litellm", "litellm_energy_router.router", "litellm_energy_router.training", "litellm_energy_router.profiling"]),
    ],
)  # fmt: skip
def test_imports_respect_layers(mods, forbidden):
    r = subprocess.run([sys.executable, "-c", CHECK.format(mods=mods, forbidden=forbidden)],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "", f"{mods} loaded {r.stdout.strip()}"
