"""Energy: profiles (J/token per candidate), meters (one Protocol; the built-ins ``estimate``, ``nvml``,
``agent`` and ``simulated`` and any plugin's, see :mod:`litellm_energy_router.plugins`) and
per-request attribution."""

from litellm_energy_router.energy.meter import (
    EnergyMeter,
    EnergyReading,
    MeterError,
    RequestEnergy,
    RequestEnergyMeter,
    RequestUsage,
    make_meter,
    registered_meters,
)
from litellm_energy_router.energy.profile import (
    EnergyProfile,
    ModelEnergy,
    ProfileError,
    bundled_profile_path,
    load_profile,
)
from litellm_energy_router.energy.request_meter import (
    AttributedMeter,
    FallbackMeter,
    open_request_meter,
)

__all__ = [
    "AttributedMeter",
    "EnergyMeter",
    "EnergyProfile",
    "EnergyReading",
    "FallbackMeter",
    "MeterError",
    "ModelEnergy",
    "ProfileError",
    "RequestEnergy",
    "RequestEnergyMeter",
    "RequestUsage",
    "bundled_profile_path",
    "load_profile",
    "make_meter",
    "open_request_meter",
    "registered_meters",
]
