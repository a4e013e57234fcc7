"""The LiteLLM integration: what runs inside a LiteLLM proxy or SDK ``Router``.

Routing half (before the call): :mod:`.core` (the routing core: knob, score, decide, fail open), :mod:`.strategy`
(the SDK strategy and the proxy filter around it), :mod:`.proxy_router`
(the proxy's pre-call filter, ``litellm_energy_router.litellm_glue.proxy_router.energy_router``),
:mod:`.decision` (what a decision records and carries to the logging half), :mod:`.deployments` (deployment
-> candidate), :mod:`.request_text` (the text routed on), :mod:`.figures` (decision-time energy and carbon
figures, response headers), :mod:`.litellm_compat` (the supported LiteLLM range).

Logging half (after the call): :mod:`.callback` (the callback that settles each served request's joules and
writes its row, ``litellm_energy_router.litellm_glue.callback.proxy_logger.energy_logger``).
"""
