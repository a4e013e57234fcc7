"""``python -m litellm_energy_router.cli`` = ``energy-router``."""

from . import main

main()
