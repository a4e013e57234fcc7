"""``python -m litellm_energy_router.cli`` = ``energy-router``."""

from litellm_energy_router.cli import main

main()
