"""Grid carbon intensity per deployment site: grams of CO2e for a number of GPU joules.

``gCO2e = J / 3.6e6 (kWh) x PUE(site) x intensity(site's region, hour) (gCO2e/kWh)``.

A deployment names its site in ``model_info.energy_router_site`` (else ``carbon.default_site``). Each site
(``carbon.sites.<name>``) has a PUE (power usage effectiveness, >= 1, dimensionless) and its intensity from,
first found:

* a provider registered through the pluggy hookspec ``energy_router_carbon_providers``
  (:mod:`litellm_energy_router.plugins`; a live source such as Electricity Maps is a third-party plugin),
  asked with the site's ``region``;
* the hourly CSV ``carbon.intensity_csv`` (header ``region,hour,g_co2e_per_kwh``; ``hour`` is an hour of the
  day 0-23 UTC, a profile repeated daily, or an ISO 8601 time such as ``2026-12-05T14:00:00Z``), by region;
* the site's static ``intensity_g_per_kwh``.

Stale or missing data (a provider error or ``None``, a timed CSV with no row for that hour) never fails a
request: the last known value of the site is used and ``energy_router_carbon_fallbacks_total{reason}``
counts it (``stale``, ``missing``, ``unknown_site``, ``provider_error``). Bad input (a negative, NaN or empty
value, an unknown site or region) is a one-line :class:`CarbonError` naming the file and line or the field,
raised when the settings are loaded (the CLI exits 2, the proxy refuses the config).
"""

from __future__ import annotations

import csv
import math
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from litellm_energy_router.errors import UnreadableFile, reading

J_PER_KWH = 3.6e6
SITE_KEY = "energy_router_site"  # model_info key naming a deployment's site
CSV_COLUMNS = ("region", "hour", "g_co2e_per_kwh")


class CarbonError(ValueError):
    """Bad carbon input; the message is one line naming the file and line, or the settings field."""


class SiteSettings(BaseModel):
    """One site (data centre) that serves deployments."""

    model_config = ConfigDict(extra="forbid")

    pue: float = Field(1.0, ge=1.0, le=5.0, allow_inf_nan=False, description="power usage effectiveness, >= 1")
    region: str | None = Field(None, min_length=1, max_length=100, description="grid region of the CSV / provider")
    intensity_g_per_kwh: float | None = Field(
        None, ge=0, le=5000, allow_inf_nan=False, description="static grid intensity, gCO2e/kWh (else CSV / provider)"
    )


class CarbonSettings(BaseModel):
    """Grid carbon intensity and PUE per site (settings section ``carbon``)."""

    model_config = ConfigDict(extra="forbid")

    sites: dict[str, SiteSettings] = Field(default_factory=dict, description="site name -> PUE and intensity source")
    default_site: str | None = Field(None, description="site of a deployment that names none")
    intensity_csv: Path | None = Field(None, description="hourly intensity CSV: region,hour,g_co2e_per_kwh")
    provider: str | None = Field(
        None, description="a plugin's carbon intensity provider (energy_router_carbon_providers)"
    )
    provider_options: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the provider's factory"
    )
    reference_g_per_kwh: float = Field(
        400.0,
        gt=0,
        le=5000,
        allow_inf_nan=False,
        description="intensity of the reference gram (objective carbon: λ per e_ref_j joules here, PUE 1), gCO2e/kWh",
    )

    @model_validator(mode="after")
    def _consistent(self) -> "CarbonSettings":
        if self.default_site is not None and self.default_site not in self.sites:
            raise ValueError(
                f"carbon.default_site {self.default_site!r} is not one of carbon.sites ({', '.join(sorted(self.sites)) or 'none'})"
            )
        for name, s in self.sites.items():
            if s.intensity_g_per_kwh is None and (
                s.region is None or (self.intensity_csv is None and self.provider is None)
            ):
                raise ValueError(
                    f"carbon.sites.{name}: needs intensity_g_per_kwh, or a region with carbon.intensity_csv or carbon.provider"
                )
        if self.intensity_csv is not None:
            table = load_intensity_csv(self.intensity_csv)
            for name, s in self.sites.items():
                if (
                    s.region is not None
                    and s.intensity_g_per_kwh is None
                    and self.provider is None
                    and s.region not in table
                ):
                    raise ValueError(f"carbon.sites.{name}.region {s.region!r}: not in {self.intensity_csv}")
        if self.provider is not None:
            from litellm_energy_router.plugins import carbon_provider_factories

            known = carbon_provider_factories()
            if self.provider not in known:
                raise ValueError(
                    f"carbon.provider {self.provider!r} is not registered (known: {', '.join(sorted(known)) or 'none'})"
                )
        return self


class IntensityProvider(Protocol):
    """A plugin's intensity source. ``intensity(region, t_s)``: gCO2e/kWh at Unix time ``t_s``, or ``None``
    when unknown. Called on the serving path: it must answer from memory (refresh in a thread of its own)."""

    def intensity(self, region: str, t_s: float) -> float | None: ...


class HourlyTable:
    """Intensity per region: an hour-of-day profile (24 values) or a timed series (Unix hour -> value)."""

    def __init__(self) -> None:
        self.daily: dict[str, dict[int, float]] = {}
        self.timed: dict[str, dict[int, float]] = {}

    def __contains__(self, region: str) -> bool:
        return region in self.daily or region in self.timed

    def highest(self, region: str) -> float | None:
        """The largest gCO2e/kWh the file holds for ``region`` (None: the region is not in it)."""
        vals = self.daily.get(region) or self.timed.get(region)
        return max(vals.values()) if vals else None

    def lookup(self, region: str, t_s: float) -> float | None:
        """gCO2e/kWh of ``region`` at ``t_s``, or ``None`` when the file has no value for that hour."""
        hour = int(t_s // 3600)
        if region in self.daily:
            return self.daily[region].get(hour % 24)
        return self.timed.get(region, {}).get(hour)


def _parse_hour(raw: str, where: str) -> tuple[str, int]:
    raw = raw.strip()
    if raw.isascii() and raw.isdigit():  # "²" is a digit to isdigit(), not to int()
        h = int(raw)
        if not 0 <= h <= 23:
            raise CarbonError(f"{where}: field 'hour' = {raw!r}: an hour of the day must be 0-23")
        return "daily", h
    try:
        t = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise CarbonError(f"{where}: field 'hour' = {raw!r}: not an hour 0-23 nor an ISO 8601 time") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return "timed", int(t.timestamp() // 3600)


def _parse_value(raw: str | None, where: str) -> float:
    if raw is None or not raw.strip():
        raise CarbonError(f"{where}: field 'g_co2e_per_kwh' is missing")
    try:
        v = float(raw)
    except ValueError:
        raise CarbonError(f"{where}: field 'g_co2e_per_kwh' = {raw!r}: not a number") from None
    if math.isnan(v) or math.isinf(v) or v < 0:
        raise CarbonError(f"{where}: field 'g_co2e_per_kwh' = {raw!r}: must be a finite number >= 0")
    return v


def load_intensity_csv(path: str | Path) -> HourlyTable:
    """Read an hourly intensity CSV (see the module docstring); one-line :class:`CarbonError` on bad input."""
    path = Path(path)
    table = HourlyTable()
    try:
        with reading(path), path.open(newline="", encoding="utf-8-sig") as f:  # a spreadsheet's BOM is no column
            reader = csv.DictReader(f)
            missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise CarbonError(f"{path}: line 1: missing column {missing[0]!r} (need {','.join(CSV_COLUMNS)})")
            for row in reader:
                where = f"{path}: line {reader.line_num}"
                region = (row.get("region") or "").strip()
                if not region:
                    raise CarbonError(f"{where}: field 'region' is missing")
                kind, hour = _parse_hour(row.get("hour") or "", where)
                other = table.timed if kind == "daily" else table.daily
                if region in other:
                    raise CarbonError(f"{where}: region {region!r} mixes hours of the day and ISO times")
                hours = (table.daily if kind == "daily" else table.timed).setdefault(region, {})
                if hour in hours:  # e.g. half-hourly rows: one would silently replace the other
                    raise CarbonError(
                        f"{where}: region {region!r} has hour {row.get('hour')!r} twice (one row per hour)"
                    )
                hours[hour] = _parse_value(row.get("g_co2e_per_kwh"), where)
    except UnreadableFile as e:  # not UTF-8 text
        raise CarbonError(str(e)) from None
    except OSError as e:
        raise CarbonError(f"{path}: cannot read ({e.strerror or e})") from None
    return table


class CarbonModel:
    """Sites, PUE and intensity at serving time (thread-safe; never raises on the serving path)."""

    def __init__(self, cfg: CarbonSettings | None = None, *, provider: IntensityProvider | None = None) -> None:
        from litellm_energy_router.metrics import CARBON_FALLBACKS

        self.cfg = cfg or CarbonSettings()
        self.table = load_intensity_csv(self.cfg.intensity_csv) if self.cfg.intensity_csv is not None else None
        if provider is None and self.cfg.provider is not None:
            from litellm_energy_router.plugins import carbon_provider_factories

            provider = carbon_provider_factories()[self.cfg.provider](**self.cfg.provider_options)
        self.provider = provider
        self._fallbacks = CARBON_FALLBACKS
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.sites)

    def site_of(self, model_info: Mapping[str, Any] | None) -> str | None:
        """The site a deployment (its ``model_info``) runs in: its ``energy_router_site`` when configured,
        else ``carbon.default_site`` (a named but unknown site is counted as ``unknown_site``)."""
        named = (model_info or {}).get(SITE_KEY) if isinstance(model_info, Mapping) else None
        if named is not None and str(named) in self.cfg.sites:
            return str(named)
        if named is not None and self.enabled:
            self._fallbacks.labels(reason="unknown_site").inc()
        return self.cfg.default_site

    def _fresh(self, site: SiteSettings, t_s: float) -> tuple[float | None, str]:
        if site.region is not None and self.provider is not None:
            try:
                v = self.provider.intensity(site.region, t_s)
                v = None if v is None else float(v)  # a provider's "412" or object: its error, counted, not ours
            except Exception:  # noqa: BLE001 - a provider failure must not fail the request
                return None, "provider_error"
            if v is not None and math.isfinite(v) and v >= 0:
                return v, ""
            return None, "stale"
        if site.region is not None and self.table is not None and site.region in self.table:
            v = self.table.lookup(site.region, t_s)
            return (v, "") if v is not None else (None, "stale")
        return site.intensity_g_per_kwh, "" if site.intensity_g_per_kwh is not None else "missing"

    def intensity(self, site: str | None, t_s: float) -> float | None:
        """gCO2e/kWh of ``site`` at Unix time ``t_s``: fresh, else the site's last known value (counted),
        else its static value, else a conservative one: the largest its region has in ``carbon.intensity_csv``, else
        ``carbon.reference_g_per_kwh`` (a fresh process whose file or provider has no value for now: its gCO2e
        budgets still bind; they counted 0 g). ``None`` for no site."""
        s = self.cfg.sites.get(site) if site is not None else None
        if s is None:
            return None
        v, why = self._fresh(s, t_s)
        with self._lock:
            if v is not None:
                self._last[site] = v  # type: ignore[index]
                return v
            self._fallbacks.labels(reason=why).inc()
            last = self._last.get(site)  # type: ignore[arg-type]
        if last is not None:
            return last
        if s.intensity_g_per_kwh is not None:
            return s.intensity_g_per_kwh
        high = self.table.highest(s.region) if self.table is not None and s.region is not None else None
        return high if high is not None else self.cfg.reference_g_per_kwh

    def factor(self, site: str | None, t_s: float) -> float | None:
        """PUE x intensity of ``site`` at ``t_s`` over ``reference_g_per_kwh`` (dimensionless: the objective
        carbon's weight of a joule there), or ``None`` when unknown."""
        g = self.intensity(site, t_s)
        return None if g is None else self.cfg.sites[site].pue * g / self.cfg.reference_g_per_kwh  # type: ignore[index]

    def grams(self, joules: float | None, site: str | None, t_s: float) -> float | None:
        """gCO2e of ``joules`` GPU energy served at ``site`` at ``t_s`` (x PUE), or ``None`` when unknown."""
        if joules is None or site is None:
            return None
        g = self.intensity(site, t_s)
        if g is None:
            return None
        return joules / J_PER_KWH * self.cfg.sites[site].pue * g
