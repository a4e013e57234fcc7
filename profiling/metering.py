"""Joules per (query, candidate) during a tournament.

Two accountants behind one small interface (``begin()`` before a request, ``end(...)`` after it):

* :class:`EstimateAccountant` (``energy.meter: estimate``, the no-GPU default): the energy profile's
  J/prompt-token and J/output-token of the candidate times the request's token counts.
  ``energy_method="estimate"``.
* :class:`MeterAccountant` (any registered meter, e.g. ``nvml``, ``agent``): reads the meter's
  cumulative joules at every request start and end, and splits the energy of each interval between
  two readings equally across the requests in flight during it, so concurrent requests never
  double-count (the attributed joules add up to the metered joules while requests were in flight;
  idle energy between requests is not attributed). Candidates then run one after another, so a
  window only holds one candidate's work. ``energy_method`` is the meter's ``method``.
"""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any, Iterable, Protocol

from litellm_energy_router.energy.attribution import split_energy
from litellm_energy_router.energy.meter import EnergyMeter, make_meter
from litellm_energy_router.energy.profile import EnergyProfile, ModelEnergy, ProfileError, load_profile
from litellm_energy_router.settings import ConfigError

log = logging.getLogger(__name__)


class Accountant(Protocol):
    method: str
    #: run candidates one after another (a physical meter cannot tell them apart)
    sequential: bool

    def begin(self) -> Any: ...

    def end(
        self, handle: Any, candidate: str, prompt_tokens: int | None, completion_tokens: int | None
    ) -> float | None:
        """Joules of the request started by ``begin()`` (None when unknown)."""
        ...

    def close(self) -> None: ...


class EstimateAccountant:
    """Energy = profile estimate from token counts (J)."""

    method = "estimate"
    sequential = False

    def __init__(self, entries: dict[str, ModelEnergy]) -> None:
        self.entries = entries

    def begin(self) -> None:
        return None

    def end(
        self, handle: Any, candidate: str, prompt_tokens: int | None, completion_tokens: int | None
    ) -> float | None:
        if prompt_tokens is None or completion_tokens is None:
            return None
        return self.entries[candidate].estimate_j(prompt_tokens, completion_tokens)

    def close(self) -> None:
        pass


class EnergyLedger:
    """Splits a cumulative meter's energy across overlapping windows (J). Not thread-safe: call from
    one event loop. A window open while a read failed has no figure (None): the next good read's delta
    covers a span that cannot be split, and a share of it is no measurement."""

    def __init__(self, meter: EnergyMeter) -> None:
        self.meter = meter
        self._open: dict[int, float] = {}
        self._tainted: set[int] = set()  # windows open across a failed read
        self._ids = itertools.count()
        self._last = meter.read().total_j
        self.attributed_j = 0.0
        self._failed = False

    def _advance(self) -> bool:
        """Read the meter and share its delta among the open windows; False when the read failed."""
        try:
            now = float(self.meter.read().total_j)
            if not math.isfinite(now):
                raise ValueError(f"reading {now}")
        except Exception as e:  # noqa: BLE001  (a meter hiccup must not lose the tournament)
            if not self._failed:
                log.warning("energy meter %s read failed: %s", getattr(self.meter, "name", "?"), e)
            self._failed = True
            self._tainted.update(self._open)
            return False
        delta = max(0.0, now - self._last)
        self._last = now
        if self._open and delta:
            for k, share in zip(list(self._open), split_energy(delta, [1.0] * len(self._open))):
                self._open[k] += share
            self.attributed_j += delta
        return True

    def open(self) -> int:
        ok = self._advance()
        key = next(self._ids)
        self._open[key] = 0.0
        if not ok:  # its start is not known
            self._tainted.add(key)
        return key

    def close(self, key: int) -> float | None:
        """The window's joules, or None when a read failed while it was open."""
        ok = self._advance()
        j = self._open.pop(key)
        tainted = key in self._tainted or not ok
        self._tainted.discard(key)
        return None if tainted else j


class MeterAccountant:
    """Energy from a cumulative meter via :class:`EnergyLedger`."""

    sequential = True

    def __init__(self, meter: EnergyMeter) -> None:
        self.meter = meter
        self.method = meter.method
        self.ledger = EnergyLedger(meter)

    def begin(self) -> int:
        return self.ledger.open()

    def end(
        self, handle: Any, candidate: str, prompt_tokens: int | None, completion_tokens: int | None
    ) -> float | None:
        return self.ledger.close(handle)

    def close(self) -> None:
        self.meter.close()


def make_accountant(
    meter_name: str,
    *,
    candidates: Iterable[tuple[str, str]],
    profile: str | None = None,
    options: dict[str, Any] | None = None,
    meter: EnergyMeter | None = None,
) -> Accountant:
    """Build the accountant for ``meter_name``. ``candidates`` are (candidate name, profile key)
    pairs; with ``estimate`` each key must be in the profile. A meter name that is not registered
    raises :class:`ConfigError` naming it."""
    if meter is not None:
        return MeterAccountant(meter)
    if meter_name == "estimate":
        try:
            prof: EnergyProfile = load_profile(profile)
            origin = f"energy profile {profile or 'bundled ML.ENERGY H100'}"
            entries = {name: prof.get(key, origin=origin) for name, key in candidates}
        except ProfileError as e:
            raise ConfigError(f"{e}; set the candidate's energy_profile_key or energy.profile") from None
        return EstimateAccountant(entries)
    try:
        return MeterAccountant(make_meter(meter_name, **(options or {})))
    except ValueError as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    except Exception as e:  # noqa: BLE001  (driver missing, no GPU...)
        raise ConfigError(
            f"energy meter {meter_name!r} could not start: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
        ) from None
