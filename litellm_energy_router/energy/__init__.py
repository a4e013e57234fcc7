"""Energy: profiles (J/token per candidate) and, later, meters."""

from .profile import EnergyProfile, ModelEnergy, ProfileError, bundled_profile_path, load_profile

__all__ = ["EnergyProfile", "ModelEnergy", "ProfileError", "bundled_profile_path", "load_profile"]
