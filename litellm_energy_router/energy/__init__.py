"""Energy: profiles (J/token per candidate), meters (one Protocol, one registry) and per-request
attribution. Importing this package registers the meters ``estimate``, ``nvml``, ``agent`` and
``simulated``."""

from . import agent_client, estimate, nvml, simulated  # noqa: F401  (register the meters)
from .meter import (
    EnergyMeter,
    EnergyReading,
    MeterError,
    RequestEnergy,
    RequestEnergyMeter,
    RequestUsage,
    make_meter,
    register_meter,
    registered_meters,
)
from .profile import EnergyProfile, ModelEnergy, ProfileError, bundled_profile_path, load_profile
from .request_meter import AttributedMeter, FallbackMeter, open_request_meter

__all__ = [
    "AttributedMeter", "EnergyMeter", "EnergyProfile", "EnergyReading", "FallbackMeter", "MeterError", "ModelEnergy",
    "ProfileError", "RequestEnergy", "RequestEnergyMeter", "RequestUsage", "bundled_profile_path", "load_profile",
    "make_meter", "open_request_meter", "register_meter", "registered_meters",
]
