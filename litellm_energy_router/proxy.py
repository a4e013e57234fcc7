"""LiteLLM proxy entry point. Add to the proxy's ``config.yaml``::

    litellm_settings:
      callbacks: ["litellm_energy_router.proxy.energy_router"]

Settings come from ``$ENERGY_ROUTER_CONFIG`` (a YAML file) and ``ENERGY_ROUTER_*`` variables; the router
is loaded on the first request.
"""

from __future__ import annotations

from .strategy import EnergyRouterFilter

energy_router = EnergyRouterFilter()
