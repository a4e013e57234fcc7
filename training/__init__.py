"""Training the LM router from the tournament table (installed as ``litellm_energy_router.training``).

Never imported by the serving path (router runtime, strategy, proxy plugin, callback).
"""
