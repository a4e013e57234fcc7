"""Profiling: fill the tournament table (installed as ``litellm_energy_router.profiling``).

Sources: the offline tournament (:mod:`.runner`, its records in :mod:`.tournament_records`, configured by
:mod:`.config`; tasks in :mod:`.tasks`, graded with the code :mod:`.sandbox` and the LLM :mod:`.judge`, joules
from :mod:`.metering`), shadow tournaments over queued production queries (:mod:`.shadow_tournament`), single-GPU
vLLM offline profiling (:mod:`.vllm_offline`, extra ``gpu``), imports of recorded benchmark rows
(:mod:`.routerbench`) and energy profiles derived from ML.ENERGY measurements (:mod:`.mlenergy`).
Never imports the LiteLLM serving glue (strategy, plugin, callback).
"""
