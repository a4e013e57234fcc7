"""Serve prompts through a real ``litellm.Router`` with the energy strategy and the energy callback.

One deployment per candidate, all pointing at the :class:`~.backend.LocalBackend` replaying RouterBench,
tagged with ``model_info.energy_router_candidate``; :class:`~litellm_energy_router.litellm_glue.strategy.EnergyRoutingStrategy`
picks the deployment, :class:`~litellm_energy_router.litellm_glue.callback.EnergyLogger` writes one production row
per request into the table (energy from the settings' per-request meter).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from litellm_energy_router.demo.backend import deployment_id, model_list
from litellm_energy_router.settings import Settings

MODEL_GROUP = "demo-pool"


@dataclass
class ServedCall:
    """One request as the client saw it: which prompt, which LiteLLM call id, which deployment answered."""

    index: int  # position in the prompts given to :func:`serve`
    call_id: str
    deployment_id: str
    candidate: str
    answer: str
    latency_s: float


async def _serve(
    prompts: Sequence[str],
    candidates: Sequence[str],
    api_base: str,
    settings: Settings,
    concurrency: int,
    progress: Callable[[int], None] | None,
    metadata: dict[str, Any] | None = None,
) -> tuple[list[ServedCall], Any]:
    import litellm

    from litellm_energy_router.litellm_glue.callback import EnergyLogger
    from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
    from litellm_energy_router.litellm_glue.strategy import (
        EnergyRouterCore,
        EnergyRoutingStrategy,
    )

    logger = EnergyLogger(settings)
    previous = list(litellm.callbacks)
    litellm.callbacks = [logger]
    by_id = {deployment_id(c): c for c in candidates}
    try:
        router = litellm.Router(model_list=model_list(api_base, candidates, group=MODEL_GROUP), num_retries=2)
        core = EnergyRouterCore(settings)  # inside the running loop: the checkpoint loads on a thread
        await asyncio.to_thread(core.runtime.wait_ready, 300)  # serve once it is ready, off the loop
        register_strategy(router, EnergyRoutingStrategy(router, core=core))
        sem = asyncio.Semaphore(max(1, concurrency))
        served: list[ServedCall] = []

        async def one(i: int, prompt: str) -> None:
            async with sem:
                t = time.perf_counter()
                kw = {"metadata": dict(metadata)} if metadata else {}
                resp = await router.acompletion(model=MODEL_GROUP, messages=[{"role": "user", "content": prompt}], **kw)
                hp = resp._hidden_params
                dep = str(hp.get("model_id"))
                served.append(
                    ServedCall(
                        i,
                        str(hp["litellm_call_id"]),
                        dep,
                        by_id.get(dep, dep),
                        resp.choices[0].message.content or "",
                        time.perf_counter() - t,
                    )
                )
                if progress:
                    progress(1)

        await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        # LiteLLM runs success callbacks in tasks scheduled after each response: let them run
        deadline = time.monotonic() + 60
        while logger.writer.submitted < len(served) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        core.runtime.close()
        return sorted(served, key=lambda s: s.index), logger
    finally:
        litellm.callbacks = previous


def serve(
    prompts: Sequence[str],
    candidates: Sequence[str],
    api_base: str,
    settings: Settings,
    *,
    concurrency: int = 8,
    progress: Callable[[int], None] | None = None,
    metadata: dict[str, Any] | None = None,
) -> tuple[list[ServedCall], dict[str, int]]:
    """Send every prompt through the router; wait until the callback wrote every row to the table. ``metadata``:
    every request's (the fields a proxy would set for the caller's key, e.g. ``user_api_key_alias``: one app).
    Returns the calls (in prompt order) and the writer's counts (submitted, written, spooled)."""
    import litellm

    litellm.suppress_debug_info = True
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    served, logger = asyncio.run(_serve(prompts, candidates, api_base, settings, concurrency, progress, metadata))
    logger.flush(120)
    counts = {"submitted": logger.writer.submitted, "written": logger.writer.written, "spooled": logger.writer.spooled}
    logger.close()
    reset = getattr(getattr(litellm, "logging_callback_manager", None), "_reset_all_callbacks", None)
    if reset is not None:  # LiteLLM keeps one instance per callback class: drop ours
        reset()
    return served, counts
