"""Dependency rules: the serving path never loads TRL or the training package; training and profiling never
load the LiteLLM glue; the table loads nothing above it (checked in fresh interpreters). And no import circle
among the project's own modules (the import graph from the source, module- and function-level imports)."""

from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import TopologicalSorter
from pathlib import Path

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

CHECK = """
import sys
import {mods}
bad = sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in {forbidden!r}))
print(",".join(bad))
"""


@pytest.mark.parametrize(
    "mods, forbidden",
    [
        (
            "litellm_energy_router.litellm_glue.strategy, litellm_energy_router.litellm_glue.proxy_router, litellm_energy_router.litellm_glue.callback, "
            "litellm_energy_router.router.runtime, litellm_energy_router.router.model, litellm_energy_router.router.student, "
            "litellm_energy_router.router.fastpath",
            ["trl", "litellm_energy_router.training"],
        ),
        (
            "litellm_energy_router.training.pipeline, litellm_energy_router.training.crossval, "
            "litellm_energy_router.profiling.runner",
            [
                "litellm_energy_router.litellm_glue.strategy",
                "litellm_energy_router.litellm_glue.proxy_router",
                "litellm_energy_router.litellm_glue.callback",
            ],
        ),
        # the demo sits above serving and training: it imports training only inside functions
        (
            "litellm_energy_router.demo.loop, litellm_energy_router.demo.serve, litellm_energy_router.demo.compare, "
            "litellm_energy_router.demo.backend, litellm_energy_router.demo.task_answers, litellm_energy_router.cli",
            ["trl", "litellm_energy_router.training"],
        ),
        (
            "litellm_energy_router.table",
            [
                "litellm",
                "litellm_energy_router.router",
                "litellm_energy_router.training",
                "litellm_energy_router.profiling",
            ],
        ),
    ],
)
def test_imports_respect_layers(mods, forbidden):
    r = subprocess.run(
        [sys.executable, "-c", CHECK.format(mods=mods, forbidden=forbidden)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "", f"{mods} loaded {r.stdout.strip()}"


# -- no import circle among the project's own modules ----------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "litellm_energy_router": ROOT / "litellm_energy_router",
    "litellm_energy_router.profiling": ROOT / "profiling",
    "litellm_energy_router.training": ROOT / "training",
}


def _modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file of every module of the three packages (as installed: profiling and training
    inside ``litellm_energy_router``)."""
    out = {}
    for pkg, d in PACKAGES.items():
        d = root / d.relative_to(ROOT)
        for f in d.rglob("*.py"):
            parts = list(f.relative_to(d).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([pkg, *parts])] = f
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at module level or inside functions (``import a.b``,
    ``from a import b`` with ``b`` a module or a name, relative imports). An import names the module it
    names: the parent packages it initialises on the way are not edges. Imports under ``if TYPE_CHECKING:``
    never run and are not edges."""
    mods = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, f in mods.items():
        is_pkg = f.name == "__init__.py"
        tree = ast.parse(f.read_text(), str(f))
        typing_only = {
            id(n)
            for blk in ast.walk(tree)
            if isinstance(blk, ast.If) and _is_type_checking(blk.test)
            for stmt in blk.body
            for n in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".")
                    base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:  # `import a.b.c` of a name inside a module: the module
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each an import circle or several)."""
    names = sorted(graph)
    ix = {m: i for i, m in enumerate(names)}
    rows = [ix[a] for a in names for b in graph[a]]
    cols = [ix[b] for a in names for b in graph[a]]
    adj = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(names)))
    n, labels = connected_components(adj, directed=True, connection="strong")
    comps = [[names[i] for i in np.flatnonzero(labels == c)] for c in range(n)]
    return sorted(c for c in comps if len(c) > 1)


def test_import_graph_is_acyclic():
    graph = import_graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300  # the walk really found the project
    assert "litellm_energy_router.training.pairs" in graph["litellm_energy_router.training.energy_fit"]
    assert import_cycles(graph) == []
    TopologicalSorter(graph).prepare()  # raises CycleError naming a circle


def test_cycle_finder_sees_function_level_imports(tmp_path):
    """A circle closed only by an import inside a function is found."""
    for d in PACKAGES.values():
        (tmp_path / d.relative_to(ROOT)).mkdir(parents=True)
        (tmp_path / d.relative_to(ROOT) / "__init__.py").write_text("")
    (tmp_path / "training" / "a.py").write_text("from .b import x\n")
    (tmp_path / "training" / "b.py").write_text("def x():\n    from litellm_energy_router.training import a\n")
    assert import_cycles(import_graph(tmp_path)) == [
        ["litellm_energy_router.training.a", "litellm_energy_router.training.b"]
    ]
