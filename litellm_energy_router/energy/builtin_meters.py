"""The built-in energy meters as a plugin (entry point ``builtin_meters``): names -> lazy factories,
so listing the meters imports none of them (nor NVML, nor httpx)."""

from __future__ import annotations

from ..plugins import hookimpl, lazy


@hookimpl
def energy_router_meters() -> dict:
    return {
        "estimate": lazy("litellm_energy_router.energy.estimate:EstimateMeter"),
        "nvml": lazy("litellm_energy_router.energy.nvml:NvmlMeter"),
        "agent": lazy("litellm_energy_router.agent.client:AgentMeter"),
        "simulated": lazy("litellm_energy_router.energy.simulated:SimulatedMeter"),
    }
