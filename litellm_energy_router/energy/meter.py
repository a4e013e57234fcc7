"""The energy-meter interface: one Protocol; meters come from plugins.

A meter reports **cumulative** GPU energy. Energy over a window is the difference of two readings::

    meter = make_meter("nvml")
    a = meter.read(); ...work...; b = meter.read()
    joules = b.total_j - a.total_j        # J, summed over the meter's GPUs

Implementations are provided under a short name (``nvml``, ``estimate``, ``agent``, ``simulated``...)
by the ``energy_router_meters`` hook of a plugin (:mod:`litellm_energy_router.plugins`; the built-ins in
:mod:`.builtin_meters`) and say in ``method`` how the joules were obtained — the value written to the
table's ``energy_method`` column.

**Per request.** Under continuous batching a request's energy is not the counter delta over its own
window (other requests run at the same time). The callback therefore asks one
:class:`RequestEnergyMeter` for ``energy_for_request(usage)``, whatever the meter behind it: the
``estimate`` and ``agent`` meters answer directly, counter meters (``nvml``, ``simulated``) are wrapped
in :class:`~.request_meter.AttributedMeter`, which splits each sampled interval's joules across the
requests in flight by tokens processed (:mod:`.attribution`). Build it with
:func:`~.request_meter.open_request_meter`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from litellm_energy_router.plugins import meter_factories
from litellm_energy_router.table.rows import ENERGY_METHOD_PATTERN, EnergyMethod


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


def make_meter(name: str, **kwargs: Any) -> EnergyMeter:
    """Build the meter registered as ``name`` (built-in or plugin, see :mod:`litellm_energy_router.plugins`).

    An unknown name raises ``ValueError`` listing the known ones; a meter whose ``method`` is not a valid
    ``energy_method`` (lower-case word, at most 16 characters) or not one its registration declares raises
    :class:`MeterError`.
    """
    factories = meter_factories()
    try:
        factory = factories[name]
    except KeyError:
        raise ValueError(
            f"energy meter {name!r} is not registered (known: {', '.join(sorted(factories)) or 'none'})"
        ) from None
    meter = factory(**kwargs)
    method = getattr(meter, "method", None)
    declared = getattr(factory, "methods", ())
    if (
        not isinstance(method, str)
        or not re.match(ENERGY_METHOD_PATTERN, method)
        or (declared and method not in declared)
    ):
        meter.close()
        want = f"one of {', '.join(declared)}" if declared else "a lower-case word of at most 16 characters"
        raise MeterError(f"energy meter {name!r}: method {method!r} is not {want}")
    return meter


def measured_methods() -> frozenset[str]:
    """The ``energy_method`` values whose joules are measured: those of every registered meter that
    declares ``measured`` (:class:`~litellm_energy_router.plugins.MeterSpec`), plugins' included."""
    from litellm_energy_router.plugins import meter_specs

    return frozenset(m for s in meter_specs().values() if s.measured for m in s.methods)


def is_measured(method: str | None) -> bool:
    """Whether a row's ``energy_method`` names measured joules (the meter registry's answer)."""
    return method is not None and method in measured_methods()


def meter_options(name: str, energy: Any) -> dict[str, Any]:
    """The device options (e.g. ``gpus``) of ``energy`` (an ``EnergySettings``) that meter ``name`` asks
    for in its registration, those that are set."""
    from litellm_energy_router.plugins import meter_specs

    spec = meter_specs().get(name)
    opts = spec.options if spec is not None else ()
    return {o: v for o in opts if (v := getattr(energy, o, None)) is not None}


def registered_meters() -> list[str]:
    """Names of the meters of every installed plugin (built-ins included)."""
    return sorted(meter_factories())


class MeterError(RuntimeError):
    """A meter cannot work here (no driver, agent unreachable...). One line naming the cause and the
    fallback to configure."""


@dataclass(frozen=True)
class RequestUsage:
    """What the proxy knows about one finished request.

    Attributes:
        request_id: id the GPU node knows the request by (LiteLLM call id, or the backend response id —
            vLLM's response id is ``chatcmpl-<X-Request-Id>``).
        candidate: candidate (table name) that served it.
        start_s: request start, Unix seconds.
        end_s: request end, Unix seconds.
        first_token_s: time of the first output token, Unix seconds; ``None`` when unknown
            (non-streaming calls).
        prompt_tokens: prompt tokens (prefill).
        completion_tokens: output tokens (decode).
        backend_id: the backend's own response id, when different from ``request_id``.
    """

    request_id: str
    candidate: str
    start_s: float
    end_s: float
    first_token_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    backend_id: str | None = None


@dataclass(frozen=True)
class RequestEnergy:
    """Energy attributed to one request.

    Attributes:
        energy_j: joules (J) attributed to the request; ``None`` = no energy can be given (e.g. the
            profile has no entry for the candidate) — final, unlike a ``None`` answer, which means
            "ask again later".
        method: how they were obtained (the table's ``energy_method``).
        avg_power_w: ``energy_j`` over the request's duration, watts (W).
        gpu: GPU model name(s), when known.
        settled: ``False`` for a provisional value (gave up waiting for overlapping requests).
    """

    energy_j: float | None
    method: EnergyMethod | None
    avg_power_w: float | None = None
    gpu: str | None = None
    settled: bool = True

    @classmethod
    def unavailable(cls) -> "RequestEnergy":
        return cls(energy_j=None, method=None)


@runtime_checkable
class RequestEnergyMeter(Protocol):
    """The per-request energy API the callback uses, whatever the meter.

    ``request_started`` is called on the serving hot path (must be cheap, never block);
    ``energy_for_request`` is called from the writer thread (may block briefly, e.g. an HTTP call) and
    returns ``None`` while the answer is not known yet (the writer asks again later).
    """

    name: str
    method: EnergyMethod

    def request_started(self, request_id: str, t_s: float) -> None:
        """A request started at ``t_s`` (Unix s)."""
        ...

    def energy_for_request(self, usage: RequestUsage, *, final: bool = False) -> RequestEnergy | None:
        """Joules of one finished request; ``None`` = ask again later. ``final=True``: give the best
        answer now (possibly ``settled=False``) or ``None`` when there is none."""
        ...

    def close(self) -> None: ...
