"""Extension points: energy meters, profiling tasks and router scorers, registered through pluggy.

Every implementation, built-in or third-party, is found the same way: a module with pluggy hook
implementations, named by an entry point of the group ``litellm_energy_router``::

    # pyproject.toml of a plugin
    [project.entry-points.litellm_energy_router]
    rocm = "energy_router_rocm"

    # energy_router_rocm/__init__.py
    from litellm_energy_router.plugins import hookimpl

    @hookimpl
    def energy_router_meters():
        return {"rocm": RocmMeter}          # name -> factory (a class is a factory)

Each hook returns a dict name -> factory; :func:`meter_factories`, :func:`task_factories` and
:func:`scorer_factories` merge them over all plugins and refuse a name two plugins provide. The
built-ins are plugins like any other (entry points ``builtin_meters``, ``builtin_tasks``... in this
package's pyproject.toml). Hook modules stay lean: they map names to :func:`lazy` factories, so
listing what is installed never imports an implementation (nor torch, transformers, NVML...).
See ``docs/plugins.md``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import pluggy

from litellm_energy_router.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from litellm_energy_router.energy.meter import EnergyMeter
    from litellm_energy_router.profiling.tasks.base import Task
    from litellm_energy_router.router.checkpoint import Manifest

GROUP = "litellm_energy_router"
"""The entry-point group, and pluggy's project name (markers must use it)."""

hookspec = pluggy.HookspecMarker(GROUP)
hookimpl = pluggy.HookimplMarker(GROUP)


class PluginError(UserError, ValueError):
    """A plugin cannot be loaded or conflicts with another; the message is one line naming both."""


class Hookspecs:
    """The extension points. Each hook takes no argument and returns ``{name: factory}``."""

    @hookspec
    def energy_router_meters(self) -> "Mapping[str, Callable[..., EnergyMeter]]":
        """Energy meters: ``factory(**options)`` returns an object with ``name``, ``method`` (one of the
        table's ``energy_method`` values), ``read() -> EnergyReading`` (cumulative J per GPU) and
        ``close()``. Selected by ``energy.meter: <name>``; ``energy.options`` are the keyword arguments."""

    @hookspec
    def energy_router_tasks(self) -> "Mapping[str, Callable[[], Task]]":
        """Profiling tasks: ``factory()`` returns a :class:`~litellm_energy_router.profiling.tasks.Task`
        (loader + prompt format + grader) whose ``name`` is the registered name."""

    @hookspec
    def energy_router_scorers(self) -> "Mapping[str, Callable[[Path, Manifest], Any] | ScorerSpec]":
        """Router scorers: ``factory(checkpoint_dir, manifest)`` returns an object with ``candidates``,
        ``version``, ``score(texts, tasks) -> P[n, K]`` and ``energy(texts, tasks) -> E[n, K]`` (serving
        only), or a :class:`ScorerSpec` (serving, and training, cross-validation, selection, ``eval``)."""

    @hookspec
    def energy_router_carbon_providers(self) -> "Mapping[str, Callable[..., Any]]":
        """Grid carbon intensity providers: ``factory(**options)`` returns an object with
        ``intensity(region, t_s) -> gCO2e/kWh | None`` (answered from memory: it runs on the serving path).
        Selected by ``carbon.provider: <name>``; ``carbon.provider_options`` are the keyword arguments
        (:mod:`litellm_energy_router.energy.carbon`)."""


@functools.cache
def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with every installed ``litellm_energy_router`` entry point
    loaded (built-ins included)."""
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(Hookspecs)
    load_entry_points(pm)
    return pm


_DISTS: dict[str, str] = {}  # plugin name -> "distribution version", for messages


def load_entry_points(pm: pluggy.PluginManager | None = None) -> list[str]:
    """Register the ``litellm_energy_router`` entry points not registered yet (e.g. after installing a
    plugin into a running process); returns the names added."""
    pm = pm or get_plugin_manager()
    added = []
    for ep in importlib.metadata.entry_points(group=GROUP):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown distribution"
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            if _DISTS.get(ep.name, dist) != dist:
                raise PluginError(
                    f"plugin name {ep.name!r} is declared by two distributions: {_DISTS[ep.name]} and {dist}"
                )
            continue
        try:
            plugin = ep.load()
        except Exception as e:  # noqa: BLE001 - any import failure of a third-party module
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise PluginError(
                f"plugin {ep.name!r} ({dist}): cannot load {ep.value!r}: {type(e).__name__}: {first}"
            ) from None
        try:
            pm.register(plugin, name=ep.name)
            pm.check_pending()  # a hook name no spec has (a typo) is an error, not silence
        except (ValueError, pluggy.PluginValidationError) as e:
            raise PluginError(f"plugin {ep.name!r} ({dist}): {str(e).splitlines()[0]}") from None
        _DISTS[ep.name] = dist
        added.append(ep.name)
    return added


def _label(plugin_name: str) -> str:
    return f"{plugin_name!r} ({_DISTS[plugin_name]})" if plugin_name in _DISTS else repr(plugin_name)


def _merged(hook: str, what: str) -> dict[str, Callable[..., Any]]:
    """Union of the dicts every plugin's ``hook`` returns; a name two plugins give is refused."""
    pm = get_plugin_manager()
    out: dict[str, Callable[..., Any]] = {}
    owner: dict[str, str] = {}
    impls = [i for i in getattr(pm.hook, hook).get_hookimpls() if not (i.hookwrapper or i.wrapper)]
    for impl in impls:  # registration order (pluggy calls them in reverse; the result is the same)
        got = impl.function()
        if got is None:
            continue
        if not isinstance(got, Mapping):
            raise PluginError(
                f"plugin {_label(impl.plugin_name)}: {hook}() returned {type(got).__name__}, expected a dict name -> factory"
            )
        for name, factory in got.items():
            if not isinstance(name, str) or not name:
                raise PluginError(
                    f"plugin {_label(impl.plugin_name)}: {hook}() gave the {what} name {name!r} (need a non-empty string)"
                )
            if not callable(factory):
                raise PluginError(
                    f"plugin {_label(impl.plugin_name)}: {what} {name!r} is {type(factory).__name__}, not a factory"
                )
            if name in out:
                raise PluginError(
                    f"{what} {name!r} is provided by two plugins: {_label(owner[name])} and {_label(impl.plugin_name)}"
                )
            out[name], owner[name] = factory, impl.plugin_name
    return out


@dataclass(frozen=True)
class ScorerSpec:
    """A registered scorer kind: how it is served and, with ``fit``, how it is trained. The one registry of
    scorer names for serving, ``train --scorer``, cross-validation, model selection (``retrain`` with
    ``select: true``) and ``eval``. Calling it is calling ``load``.

    Attributes:
        load: ``load(checkpoint_dir, manifest)`` → a :class:`~litellm_energy_router.router.scoring.Scorer`.
        fit: ``fit(**context)`` → an unfitted predictor: ``fit(train) -> self`` and ``predict_proba(test)
            -> P[n, K]`` on a :class:`~litellm_energy_router.training.data.TableMatrix`; for the generic
            checkpoint also ``export_arrays() -> {name: ndarray}``, ``params`` (JSON-able) and
            ``uses_embeddings``. ``context``: ``embedder``, ``seed``, ``train_config``, ``log``, ``share``
            (take what you need, ignore the rest). None: served only.
        export: ``export(kind, matrix, out_dir, **context)`` writes a checkpoint ``load`` serves (context
            also ``selection``, ``pairs``, ``partial``); None: the generic one
            (:func:`litellm_energy_router.training.baselines.export_baseline`: ``baseline.npz`` holding
            ``export_arrays()`` and the task prior, the manifest's ``scorer`` = the kind).
        default: judged by model selection and ``eval`` when the scorers are not named.
        rank: simplicity; an exact tie in selection goes to the lower rank (cheaper to serve).
        baseline: one of the baselines the LM router is compared with (``best_baseline``).
        stack_base: a base of a ``combines`` scorer.
        combines: cross-fitted on the ``stack_base`` scorers' out-of-fold P (the stack), not fitted alone.
        select_as: the name selection, ``eval`` and retrain use for it (default: the kind).
    """

    load: Callable[..., Any]
    fit: Callable[..., Any] | None = None
    export: Callable[..., Any] | None = None
    default: bool = False
    rank: int = 100
    baseline: bool = True
    stack_base: bool = False
    combines: bool = False
    select_as: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load(*args, **kwargs)


@dataclass(frozen=True)
class MeterSpec:
    """A registered energy meter: how to build it and what it measures. Calling it is calling ``load``.

    Attributes:
        load: ``load(**options)`` → an :class:`~litellm_energy_router.energy.meter.EnergyMeter`.
        methods: the ``energy_method`` values its readings carry (the table's column).
        measured: True when its joules are measured on the device (a counter or power readings), so rows
            and the energy fit treat them as measured; False for estimates and simulations.
        options: the ``energy`` settings it takes (e.g. ``gpus``): each one set is passed to ``load``.
    """

    load: Callable[..., Any]
    methods: tuple[str, ...] = ()
    measured: bool = False
    options: tuple[str, ...] = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load(*args, **kwargs)


def meter_specs() -> dict[str, MeterSpec]:
    """Energy meter name -> :class:`MeterSpec` (a plain factory: methods unknown, not measured, no options)."""
    return {n: f if isinstance(f, MeterSpec) else MeterSpec(load=f) for n, f in meter_factories().items()}


def meter_factories() -> dict[str, Callable[..., "EnergyMeter"]]:
    """Energy meter name -> factory, over all plugins."""
    return _merged("energy_router_meters", "energy meter")


def task_factories() -> dict[str, Callable[[], "Task"]]:
    """Profiling task name -> factory, over all plugins."""
    return _merged("energy_router_tasks", "task")


def scorer_factories() -> dict[str, Callable[["Path", "Manifest"], Any]]:
    """Router scorer name -> factory ``(checkpoint_dir, manifest) -> scorer``, over all plugins."""
    return _merged("energy_router_scorers", "scorer")


def scorer_specs() -> dict[str, ScorerSpec]:
    """Router scorer name -> :class:`ScorerSpec` (a plain factory: served only), over all plugins."""
    return {n: f if isinstance(f, ScorerSpec) else ScorerSpec(load=f) for n, f in scorer_factories().items()}


def trainable_scorers() -> dict[str, tuple[str, ScorerSpec]]:
    """The scorers that can be trained, by the name selection and ``eval`` use: ``{name: (kind, spec)}``,
    in registration order."""
    return {s.select_as or n: (n, s) for n, s in scorer_specs().items() if s.fit is not None}


def carbon_provider_factories() -> dict[str, Callable[..., Any]]:
    """Carbon intensity provider name -> factory ``(**options) -> provider``, over all plugins."""
    return _merged("energy_router_carbon_providers", "carbon provider")


def lazy(target: str) -> Callable[..., Any]:
    """A factory for ``"package.module:attr"`` that imports the module only when called, then calls
    ``attr(*args, **kwargs)``: hook modules list names without importing implementations."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"lazy target {target!r}: expected 'package.module:attr'")

    def factory(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)

    factory.__name__ = factory.__qualname__ = f"lazy({target})"
    factory.target = target  # type: ignore[attr-defined]
    return factory
