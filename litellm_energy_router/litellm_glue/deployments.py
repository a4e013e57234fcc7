"""Deployment → candidate: which router candidate a LiteLLM deployment serves (one mapping, used by
the routing strategy to pick and by the callback to record).

In order: the deployment's ``model_info.energy_router_candidate``; by id (``model_info.id`` equal to a
settings candidate's ``deployment_id``, or to a candidate name); by name (``litellm_params.model``
equal to a candidate name or a settings candidate's ``model``, with or without the provider prefix).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

CANDIDATE_KEY = "energy_router_candidate"  # model_info key naming a deployment's candidate


def deployment_keys(deployment: Mapping[str, Any] | None) -> tuple[str | None, str | None, str | None]:
    """(``model_info.id``, ``litellm_params.model``, ``model_info.energy_router_candidate``) of a deployment dict."""
    if not deployment:
        return None, None, None
    info = deployment.get("model_info") or {}
    info = info if type(info) is dict or isinstance(info, Mapping) else {}  # dict first: the ABC check is slower
    params = deployment.get("litellm_params") or {}
    model = params.get("model") if type(params) is dict or isinstance(params, Mapping) else None
    dep_id, tag = info.get("id"), info.get(CANDIDATE_KEY)
    return (str(dep_id) if dep_id is not None else None, str(model) if model else None, str(tag) if tag else None)


class CandidateMap:
    """The configured candidates (settings ``candidates[]``: ``name``, ``deployment_id``, ``model``)."""

    def __init__(self, candidates: Iterable[Any] = ()) -> None:
        self.by_id: dict[str, str] = {}
        self.by_model: dict[str, str] = {}
        self.names: set[str] = set()
        self.info: dict[str, dict[str, Any]] = {}
        for c in candidates:
            self.names.add(c.name)
            self.info[c.name] = {k: getattr(c, k) for k in ("model", "params_b", "active_params_b", "hardware")}
            if c.deployment_id:
                self.by_id[c.deployment_id] = c.name
            if c.model:
                self.by_model.setdefault(c.model, c.name)

    def lookup(
        self,
        model_id: str | None,
        model: str | None,
        tagged: str | None = None,
        known: Iterable[str] = (),
        by: Iterable[str] = ("id", "name"),
    ) -> str | None:
        """The candidate of a deployment from its keys, or None. ``known``: more candidate names (the
        checkpoint's); ``by``: which of the id and name rules apply (the tag always does)."""
        if tagged:
            return tagged
        names = self.names.union(known)
        if "id" in by and model_id:
            if model_id in self.by_id:
                return self.by_id[model_id]
            if model_id in names:
                return model_id
        if "name" in by and model:
            if model in names:
                return model
            if model in self.by_model:
                return self.by_model[model]
            tail = model.split("/", 1)[-1]  # "openai/small" -> "small"
            if tail in names:
                return tail
        return None

    def resolve(
        self,
        model_id: str | None,
        model: str | None,
        chosen: str | None,
        chosen_id: str | None,
        tagged: str | None = None,
    ) -> str | None:
        """The served deployment's candidate (callback): :meth:`lookup`; when the served model is not a
        configured candidate, the router's choice if it names this deployment; else the raw model string."""
        found = self.lookup(model_id, model, tagged)
        if found is not None:
            return found
        if chosen and (chosen_id is None or chosen_id == model_id):
            return chosen
        return model or None
