"""The energy-meter interface: one Protocol, one registry.

A meter reports **cumulative** GPU energy. Energy over a window is the difference of two readings::

    meter = make_meter("nvml")
    a = meter.read(); ...work...; b = meter.read()
    joules = b.total_j - a.total_j        # J, summed over the meter's GPUs

Implementations register themselves with :func:`register_meter` under a short name (``nvml``,
``estimate``, ``agent``, ``simulated``...) and say in ``method`` how the joules were obtained — the
value written to the table's ``energy_method`` column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from ..table.rows import EnergyMethod


@dataclass(frozen=True)
class EnergyReading:
    """Cumulative energy per GPU at one instant.

    Attributes:
        timestamp_s: time of the reading, seconds (``time.monotonic()`` of the reading process).
        joules: cumulative energy per GPU index since an arbitrary origin, joules (J).
    """

    timestamp_s: float
    joules: dict[int, float] = field(default_factory=dict)

    @property
    def total_j(self) -> float:
        """Sum over GPUs, joules."""
        return float(sum(self.joules.values()))


@runtime_checkable
class EnergyMeter(Protocol):
    """Anything that can report cumulative GPU energy."""

    name: str
    method: EnergyMethod

    def read(self) -> EnergyReading:
        """Cumulative energy per GPU now (J)."""
        ...

    def close(self) -> None:
        """Release driver handles / threads."""
        ...


MeterFactory = Callable[..., EnergyMeter]
_REGISTRY: dict[str, MeterFactory] = {}


def register_meter(name: str) -> Callable[[MeterFactory], MeterFactory]:
    """Class/function decorator: make a meter constructible as ``make_meter(name, **kw)``."""

    def deco(factory: MeterFactory) -> MeterFactory:
        _REGISTRY[name] = factory
        return factory

    return deco


def make_meter(name: str, **kwargs: Any) -> EnergyMeter:
    """Build a registered meter; unknown names raise ``ValueError`` listing the known ones."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"energy meter {name!r} is not registered (known: {', '.join(sorted(_REGISTRY)) or 'none'})") from None
    return factory(**kwargs)


def registered_meters() -> list[str]:
    return sorted(_REGISTRY)
