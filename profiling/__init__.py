"""Profiling: fill the tournament table (installed as ``litellm_energy_router.profiling``).

Sources: imports of recorded benchmark rows (:mod:`.routerbench`), energy profiles derived from
ML.ENERGY measurements (:mod:`.mlenergy`). Never imports the LiteLLM serving glue.
"""
