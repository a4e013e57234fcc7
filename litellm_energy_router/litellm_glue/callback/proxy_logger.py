"""For the LiteLLM proxy config::

    litellm_settings:
      callbacks: ["litellm_energy_router.litellm_glue.callback.proxy_logger.energy_logger"]

Importing this module builds one :class:`EnergyLogger` from ``$ENERGY_ROUTER_CONFIG`` /
``ENERGY_ROUTER_*`` variables (so only import it where you want the logger running).
"""

from litellm_energy_router.litellm_glue.callback.logger import EnergyLogger
from litellm_energy_router.litellm_glue.litellm_compat import quiet_refusals

energy_logger = EnergyLogger()
quiet_refusals()  # a refused call id: the logger's WARNING line, not the proxy's ERROR line
