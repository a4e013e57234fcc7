"""For the LiteLLM proxy config::

    litellm_settings:
      callbacks: ["litellm_energy_router.litellm_glue.callback.proxy_logger.energy_logger"]

Importing this module builds one :class:`EnergyLogger` from ``$ENERGY_ROUTER_CONFIG`` /
``ENERGY_ROUTER_*`` variables (so only import it where you want the logger running).
"""

import logging

from litellm.integrations.custom_logger import CustomLogger

from litellm_energy_router.energy.meter import MeterError
from litellm_energy_router.errors import UserError
from litellm_energy_router.litellm_glue.callback.logger import EnergyLogger
from litellm_energy_router.litellm_glue.litellm_compat import quiet_refusals


def _energy_logger() -> CustomLogger:
    """The logger from the settings; on a settings, table or meter error one line, and a logger that records nothing:
    the proxy serves (the router fails open the same way). It was a 400-line startup traceback, exit 3."""
    try:
        return EnergyLogger()
    except (UserError, MeterError) as e:
        logging.getLogger("litellm_energy_router").error(
            "energy-router: energy logger not started (%s); served requests are not recorded until the proxy "
            "restarts with valid settings",
            str(e).splitlines()[0],
        )
        return CustomLogger()


energy_logger = _energy_logger()
quiet_refusals()  # a refused call id: the logger's WARNING line, not the proxy's ERROR line
