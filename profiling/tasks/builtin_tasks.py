"""The built-in profiling tasks as a plugin (entry point ``builtin_tasks``): names -> lazy factories,
so listing the tasks imports none of them."""

from __future__ import annotations

from litellm_energy_router.plugins import hookimpl, lazy

_M = "litellm_energy_router.profiling.tasks"


@hookimpl
def energy_router_tasks() -> dict:
    return {
        "mmlu": lazy(f"{_M}.choice:MMLU"),
        "arc_challenge": lazy(f"{_M}.choice:ARCChallenge"),
        "hellaswag": lazy(f"{_M}.choice:HellaSwag"),
        "winogrande": lazy(f"{_M}.choice:WinoGrande"),
        "gsm8k": lazy(f"{_M}.gsm8k:GSM8K"),
        "mbpp": lazy(f"{_M}.mbpp:MBPP"),
        "mt_bench": lazy(f"{_M}.mt_bench:MTBench"),
    }
