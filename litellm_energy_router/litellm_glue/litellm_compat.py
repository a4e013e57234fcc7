"""The few LiteLLM ``Router`` calls whose names changed inside the supported LiteLLM range.

Newer releases put them behind ``router.registry()`` / ``router.health()`` and rename the strategy
hook to ``register_plugin`` (the old names survive there as deprecated aliases that warn); older
releases only have ``get_model_list`` / ``get_model_info`` / ``cooldown_cache`` /
``set_custom_routing_strategy``. Each helper prefers the new call and falls back to the old one by
feature detection (``getattr``), never by parsing ``litellm.__version__``. See docs/compatibility.md.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from typing import Any

from litellm_energy_router.errors import REFUSAL_LINES

# For a LiteLLM proxy that loads callbacks only from files next to its config.yaml
# (``proxy_imports_installed_callbacks()`` is False): save as ``energy_router_callbacks.py`` beside the
# config and list ``energy_router_callbacks.energy_router`` / ``energy_router_callbacks.energy_logger``.
PROXY_CALLBACKS_MODULE = """\
from litellm_energy_router.litellm_glue.callback.proxy_logger import energy_logger
from litellm_energy_router.litellm_glue.proxy_router import energy_router
"""


def _registry(router: Any) -> Any | None:
    registry = getattr(router, "registry", None)
    return registry() if callable(registry) else None


def register_strategy(router: Any, strategy: Any) -> None:
    """Make ``strategy`` (a ``CustomRoutingStrategyBase``) pick every deployment of ``router``."""
    register = getattr(router, "register_plugin", None)
    if callable(register):
        register(strategy)
    else:
        router.set_custom_routing_strategy(strategy)


def deployments(router: Any, model: str) -> list[dict[str, Any]]:
    """The deployment dicts of model group ``model`` (``[]`` when there are none)."""
    registry = _registry(router)
    found = registry.deployments(model) if registry is not None else router.get_model_list(model_name=model)
    return list(found or [])


def deployment_dict(router: Any, model_id: str) -> dict[str, Any] | None:
    """The deployment dict whose ``model_info.id`` is ``model_id``, or ``None``."""
    registry = _registry(router)
    d = registry.deployment_dict(model_id) if registry is not None else router.get_model_info(id=model_id)
    return d if isinstance(d, dict) else None


def cooldowns(router: Any) -> Any:
    """The router's cooldown store (``add_deployment_to_cooldown``, ``get_active_cooldowns``)."""
    health = getattr(router, "health", None)
    store = getattr(health(), "cooldowns", None) if callable(health) else None
    return store if store is not None else router.cooldown_cache


def cooling_ids(router: Any, ids: list[str]) -> set[str]:
    """Which of the deployment ids ``ids`` are cooling down now."""
    return {i for i, _ in cooldowns(router).get_active_cooldowns(ids, None)}


@functools.cache  # the installed LiteLLM does not change while the process runs: detected once, not per request
def sends_response_headers() -> bool:
    """Whether this LiteLLM's proxy calls a callback's ``async_post_call_response_headers_hook`` (1.80.x has none:
    a decision kept for its headers would never be read)."""
    from litellm.integrations.custom_logger import CustomLogger

    return hasattr(CustomLogger, "async_post_call_response_headers_hook")


def proxy_imports_installed_callbacks() -> bool:
    """Whether the proxy resolves a ``litellm_settings.callbacks`` entry such as
    ``litellm_energy_router.litellm_glue.proxy_router.energy_router`` by importing the installed package. Older proxies
    only load ``<module path>.py`` files relative to config.yaml (see ``PROXY_CALLBACKS_MODULE``)."""
    from litellm.proxy.types_utils.utils import get_instance_fn

    with tempfile.TemporaryDirectory() as d:
        try:
            get_instance_fn(f"{__name__}.__name__", config_file_path=os.path.join(d, "config.yaml"))
        except ImportError:
            return False
    return True


__all__ = [
    "PROXY_CALLBACKS_MODULE",
    "cooldowns",
    "cooling_ids",
    "deployment_dict",
    "deployments",
    "proxy_imports_installed_callbacks",
    "register_strategy",
]


PROXY_LOGGER = "LiteLLM Proxy"  # litellm._logging.verbose_proxy_logger


class _DropRefusals(logging.Filter):
    """Drops the proxy's own record of a request a pre-call hook of ours refused (a request knob,
    :class:`~.knob.KnobError`, HTTP 400; a reused call id, :class:`~.callback.call_ids.CallIdTaken`, 409: an
    ERROR line, with a traceback in some releases); the hook logs one WARNING line of its own instead. Matched
    by the exception (``energy_router_refusal``, on it or on one it was raised from or during) among the
    record's arguments or in its ``exc_info``, else by the exact text of a refusal a hook of ours just raised at
    the end of the message (:data:`~litellm_energy_router.errors.REFUSAL_LINES`, each text once), never by a
    pattern: the message also holds what the caller sent (its ``x-litellm-call-id``), so a caller could
    otherwise hide the proxy's error lines about its requests."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        exc = record.exc_info[1] if record.exc_info else None
        if any(_refusal(a) for a in (*args, exc) if isinstance(a, BaseException)):
            return False
        return not REFUSAL_LINES.take(record.getMessage())


def _refusal(e: BaseException | None, depth: int = 0) -> bool:
    """Whether ``e`` or an exception it was raised from or during (at most 5 deep) is one of our refusals."""
    if e is None or depth > 5:
        return False
    if getattr(e, "energy_router_refusal", False):
        return True
    return _refusal(e.__cause__, depth + 1) or (e.__context__ is not e.__cause__ and _refusal(e.__context__, depth + 1))


def quiet_refusals() -> None:
    """Install :class:`_DropRefusals` on LiteLLM's proxy logger (once per process). LiteLLM logs every
    exception a request raised, in ``litellm/proxy/common_request_processing.py`` ``log_llm_api_exception``
    (1.110: ``verbose_proxy_logger.error`` for a 4xx the proxy raised itself, ``.exception`` otherwise), with
    no setting a plugin could use for one exception type; a logging filter is the standard way."""
    lg = logging.getLogger(PROXY_LOGGER)
    if not any(isinstance(f, _DropRefusals) for f in lg.filters):
        lg.addFilter(_DropRefusals())


_AUTH_FLAGS = ("enable_jwt_auth", "enable_oauth2_auth", "enable_oauth2_proxy_auth")


def proxy_checks_keys() -> bool:
    """Whether the ``user_api_key_*`` fields of this process's requests name an identity a caller cannot choose: False
    only inside a LiteLLM proxy with no ``master_key``, no custom auth and no JWT / OAuth2 auth, which takes any bearer
    token and logs its hash as ``user_api_key_hash`` (a caller mints an identity per request). Outside a proxy (the
    SDK: the metadata is the operator's own code's) True. Read at each call: the proxy sets these as it starts."""
    import sys

    ps = sys.modules.get("litellm.proxy.proxy_server")
    if ps is None:
        return True
    if getattr(ps, "master_key", None) is not None or getattr(ps, "user_custom_auth", None) is not None:
        return True
    settings = getattr(ps, "general_settings", None)
    return isinstance(settings, dict) and any(settings.get(f) for f in _AUTH_FLAGS)
