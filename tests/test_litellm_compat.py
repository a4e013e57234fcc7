"""litellm_compat picks the new Router API when it is there and the old one otherwise, on stand-ins of
both shapes (the real Routers of both ends run in the litellm_integration tests)."""

from __future__ import annotations

from types import SimpleNamespace

from litellm_energy_router.litellm_glue import litellm_compat as compat

DEPS = [{"model_name": "pool", "model_info": {"id": f"dep-{c}"}} for c in ("a", "b")]


class Cooldowns:
    def __init__(self):
        self.cooling = {}

    def add_deployment_to_cooldown(self, model_id, original_exception, exception_status, cooldown_time):
        self.cooling[model_id] = cooldown_time

    def get_active_cooldowns(self, model_ids, parent_otel_span):
        return [(i, {"cooldown_time": self.cooling[i]}) for i in model_ids if i in self.cooling]


class OldRouter:
    """LiteLLM < 1.109: get_model_list / get_model_info / cooldown_cache / set_custom_routing_strategy."""

    def __init__(self):
        self.cooldown_cache = Cooldowns()
        self.strategy = None

    def get_model_list(self, model_name=None, team_id=None):
        return [d for d in DEPS if d["model_name"] == model_name] or None

    def get_model_info(self, id):
        return next((d for d in DEPS if d["model_info"]["id"] == id), None)

    def set_custom_routing_strategy(self, strategy):
        self.strategy = strategy


class NewRouter:
    """LiteLLM >= 1.109: registry() / health() / register_plugin; the old names would warn."""

    def __init__(self):
        self._cooldowns = Cooldowns()
        self.strategy = None

    def registry(self):
        return SimpleNamespace(
            deployments=lambda model: tuple(d for d in DEPS if d["model_name"] == model),
            deployment_dict=lambda i: next((d for d in DEPS if d["model_info"]["id"] == i), None),
        )

    def health(self):
        return SimpleNamespace(cooldowns=self._cooldowns)

    def register_plugin(self, strategy):
        self.strategy = strategy

    def __getattr__(self, name):
        raise AssertionError(f"deprecated Router.{name} used")


def test_both_router_shapes():
    for router in (OldRouter(), NewRouter()):
        strategy = object()
        compat.register_strategy(router, strategy)
        assert router.strategy is strategy
        assert compat.deployments(router, "pool") == DEPS and compat.deployments(router, "other") == []
        assert compat.deployment_dict(router, "dep-b") is DEPS[1] and compat.deployment_dict(router, "nope") is None
        compat.cooldowns(router).add_deployment_to_cooldown("dep-a", None, 429, 60)
        assert compat.cooling_ids(router, ["dep-a", "dep-b"]) == {"dep-a"}


def test_proxy_callbacks_module_names_the_shipped_instances():
    """Each import of the module for old proxies names an instance its module defines (read, not imported:
    importing the logger's module starts a writer)."""
    import ast
    import importlib.util
    from pathlib import Path

    for node in ast.parse(compat.PROXY_CALLBACKS_MODULE).body:
        assert isinstance(node, ast.ImportFrom)
        src = Path(importlib.util.find_spec(node.module).origin).read_text()
        for alias in node.names:
            assert f"\n{alias.name} = " in src, (node.module, alias.name)
    assert isinstance(compat.proxy_imports_installed_callbacks(), bool)
