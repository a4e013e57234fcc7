"""LiteLLM proxy entry point. Add to the proxy's ``config.yaml``::

    litellm_settings:
      callbacks: ["litellm_energy_router.litellm_glue.proxy_router.energy_router"]

(add ``litellm_energy_router.litellm_glue.callback.proxy_logger.energy_logger`` to record every served request in the
tournament table; it lives in its own module so importing the router does not start the writer; add
``prometheus`` for the proxy's ``/metrics`` to serve the ``energy_router_*`` metrics, see docs/metrics.md.)
Settings come from ``$ENERGY_ROUTER_CONFIG`` (a YAML file) and ``ENERGY_ROUTER_*`` variables. The
checkpoint starts loading when the proxy imports this module (on a thread when the proxy's event loop
is already running); requests that arrive before it is ready take the fail-open path.
"""

from __future__ import annotations

from litellm_energy_router.litellm_glue.strategy import EnergyRouterFilter

energy_router = EnergyRouterFilter()
energy_router.start()
