"""The built-in energy meters as a plugin (entry point ``builtin_meters``): names -> :class:`MeterSpec`
with lazy factories, so listing the meters imports none of them (nor NVML, nor httpx); each says which
``energy_method`` values it writes, whether its joules are measured, and the device options it takes."""

from __future__ import annotations

from litellm_energy_router.plugins import MeterSpec, hookimpl, lazy


@hookimpl
def energy_router_meters() -> dict:
    return {
        "estimate": MeterSpec(lazy("litellm_energy_router.energy.estimate:EstimateMeter"), methods=("estimate",)),
        "nvml": MeterSpec(
            lazy("litellm_energy_router.energy.nvml:NvmlMeter"),
            methods=("nvml_counter", "power_sampling"),
            measured=True,
            options=("gpus",),
        ),
        "agent": MeterSpec(lazy("litellm_energy_router.agent.client:AgentMeter"), methods=("agent",), measured=True),
        "simulated": MeterSpec(lazy("litellm_energy_router.energy.simulated:SimulatedMeter"), methods=("simulated",)),
    }
