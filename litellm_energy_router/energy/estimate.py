"""``estimate``: joules from tokens x the energy profile (J/prompt token, J/output token per candidate).

Per request it answers at once (no sampling). As a cumulative meter, ``read()`` returns the sum of
the estimates it has issued, so the two views agree. Rows carry ``energy_method = "estimate"``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from litellm_energy_router.energy.meter import (
    EnergyReading,
    RequestEnergy,
    RequestUsage,
)
from litellm_energy_router.energy.profile import (
    EnergyProfile,
    ProfileError,
    load_profile,
)


class EstimateMeter:
    """Profile-based energy estimate.

    Args:
        profile: an :class:`EnergyProfile` or a path to one (``None``: the bundled ML.ENERGY H100 profile).
        aliases: candidate name -> profile entry name, for candidates named differently in the profile.
    """

    name = "estimate"
    method = "estimate"

    def __init__(
        self, profile: EnergyProfile | str | Path | None = None, *, aliases: dict[str, str] | None = None
    ) -> None:
        self.profile = profile if isinstance(profile, EnergyProfile) else load_profile(profile)
        self.aliases = dict(aliases or {})
        self._lock = threading.Lock()
        self._total_j = 0.0
        self.unknown: set[str] = set()

    def estimate_j(self, candidate: str, prompt_tokens: int, completion_tokens: int) -> float | None:
        """Estimated J of one request, or ``None`` when the profile has no entry for the candidate."""
        key = self.aliases.get(candidate, candidate)
        try:
            return self.profile.estimate_j(key, prompt_tokens, completion_tokens)
        except ProfileError:
            self.unknown.add(candidate)
            return None

    def request_started(self, request_id: str, t_s: float) -> None:
        pass

    def energy_for_request(self, usage: RequestUsage, *, final: bool = False) -> RequestEnergy | None:
        j = self.estimate_j(usage.candidate, usage.prompt_tokens, usage.completion_tokens)
        if j is None:
            return RequestEnergy.unavailable()
        with self._lock:
            self._total_j += j
        d = usage.end_s - usage.start_s
        return RequestEnergy(energy_j=j, method="estimate", avg_power_w=j / d if d > 0 else None)

    def read(self) -> EnergyReading:
        """Sum of the estimates issued so far (J), as GPU 0."""
        with self._lock:
            return EnergyReading(timestamp_s=time.monotonic(), joules={0: self._total_j})

    def close(self) -> None:
        pass
