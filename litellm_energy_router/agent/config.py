"""The GPU-node agent's settings and bind policy: :class:`AgentConfig` (units: Hz, seconds, watts, bytes;
the fields named in :data:`FROM_ENERGY` are the ``energy.*`` settings' own), the loopback test
(:func:`is_local`) and the rule that a non-loopback bind needs a non-blank bearer token (:func:`check_bind`,
:class:`BindError`). :mod:`.server` re-exports these names.
"""

from __future__ import annotations

import ipaddress
from copy import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from litellm_energy_router.errors import UserError
from litellm_energy_router.settings import EnergySettings


class BindError(UserError, ValueError):
    """Refused to serve: a non-local bind without a token, or an unusable TLS setting."""


def is_local(host: str) -> bool:
    """True for loopback addresses and ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Raise :class:`BindError` for a non-loopback bind without a bearer token (blank counts as none)."""
    if not is_local(host) and not (token and token.strip()):
        raise BindError(
            f"agent: refusing to bind {host!r} without a bearer token (set --token, ENERGY_ROUTER_AGENT_TOKEN or "
            "energy.agent_token, or bind 127.0.0.1)"
        )


# AgentConfig fields that are energy settings: field -> its ``energy.*`` name. Type, default, bounds and
# description come from :class:`~litellm_energy_router.settings.EnergySettings` (one definition).
FROM_ENERGY = {
    "token": "agent_token",
    "sample_hz": "sample_hz",
    "history_s": "history_s",
    "prefill_weight": "prefill_weight",
    "decode_weight": "decode_weight",
    "idle_power_w": "idle_power_w",
    "max_requests": "agent_max_requests",
    "stale_s": "agent_stale_s",
    "max_body_bytes": "agent_max_body_bytes",
    "max_clock_skew_s": "agent_max_clock_skew_s",
}


class _AgentConfigBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(9400, ge=0, le=65535)
    vllm_metrics_url: str | None = None
    gpu: str | None = None
    max_segments: int = Field(1_000_000, ge=1, description="token segments tracked at most, over all requests")
    tls_cert: str | None = Field(
        None, description="PEM certificate chain; with tls_key the agent serves https (energy.agent_tls_cert)"
    )
    tls_key: str | None = Field(None, description="PEM private key of tls_cert (energy.agent_tls_key)")

    @classmethod
    def from_energy(cls, energy: EnergySettings, **overrides: Any) -> "_AgentConfigBase":
        """The agent's config from the ``energy`` settings; ``overrides`` (command-line options) win where
        not ``None``."""
        vals: dict[str, Any] = {k: getattr(energy, v) for k, v in FROM_ENERGY.items()}
        vals.update(
            tls_cert=energy.agent_tls_cert and str(energy.agent_tls_cert),
            tls_key=energy.agent_tls_key and str(energy.agent_tls_key),
        )
        vals.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**vals)


AgentConfig = create_model(
    "AgentConfig",
    __base__=_AgentConfigBase,
    __module__=__name__,
    **{
        k: (EnergySettings.model_fields[v].annotation, copy(EnergySettings.model_fields[v]))
        for k, v in FROM_ENERGY.items()
    },
)
AgentConfig.__doc__ = """Agent settings. Units: Hz, seconds, watts, bytes. Frozen: the bind policy checked at start holds.
The fields named in :data:`FROM_ENERGY` are the energy settings' own (:meth:`from_energy` reads them)."""
