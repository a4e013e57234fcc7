"""The README's and docs' examples that can be checked without running anything: every concrete
``energy-router ...`` command line in a code block parses with the real command-line parser, the
defaults the shipped settings example claims equal the code's, and ``train --help`` names every
baseline the code serves."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
import yaml

from litellm_energy_router.cli import app
from litellm_energy_router.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
META = re.compile(r"[\[\]|<>]|\.\.\.|\bURL\b|\bFILE\b|\bDIR\b")  # a synopsis line, not a command


def _command_lines():
    for doc in DOCS:
        in_code = False
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            text = line.strip().removeprefix("$ ")
            output = text.split(" ")[1].endswith(":") if " " in text else False  # a printed line, not a command
            if in_code and text.startswith("energy-router ") and not output and not META.search(text.split("#")[0]):
                yield pytest.param(text.split(" #")[0].rstrip(" \\"), id=f"{doc.name}:{n}")


LINES = list(_command_lines())


def test_the_docs_quote_commands():
    assert len(LINES) >= 5, LINES


@pytest.mark.parametrize("line", LINES)
def test_quoted_command_parses(line):
    words = shlex.split(line)[1:]
    cmd, path = typer.main.get_command(app), ["energy-router"]
    while hasattr(cmd, "commands") and words and words[0] in cmd.commands:
        path.append(words[0])
        cmd = cmd.commands[words.pop(0)]
    assert not hasattr(cmd, "commands") or any(w in ("--help", "--version") for w in words), f"{line}: no such command"
    # resilient parsing: no callback, no file check, but unknown options and commands are still refused
    cmd.make_context(" ".join(path), words, resilient_parsing=True)


def test_settings_example_shows_the_defaults():
    """config_examples/energy-router.yaml says its values are the defaults "unless noted"."""
    f = ROOT / "config_examples/energy-router.yaml"
    noted = {m.group(1) for m in re.finditer(r"^\s*(\w+):.*#\s*not a default", f.read_text(), re.M)}
    defaults = Settings().model_dump(by_alias=True, mode="json")
    diffs = []

    def walk(given, code, where):
        for k, v in given.items():
            assert k in code, f"{f.name}: {where}{k} is no setting"
            if k in noted:
                continue
            if isinstance(v, dict) and isinstance(code[k], dict):
                walk(v, code[k], f"{where}{k}.")
            elif v != code[k]:
                diffs.append(f"{where}{k}: example {v!r}, code {code[k]!r}")

    walk(yaml.safe_load(f.read_text())["energy_router"], defaults, "")
    assert not diffs, diffs


def test_train_help_names_every_baseline():
    from litellm_energy_router.cli.router_cmds import _builtin_trainable

    BASELINE_KINDS = _builtin_trainable()

    train = typer.main.get_command(app).commands["train"]
    help_text = next(p.help for p in train.params if p.name == "scorer")
    assert all(k in help_text for k in BASELINE_KINDS), help_text
    readme = (ROOT / "README.md").read_text()
    assert "--scorer lm|" + "|".join(BASELINE_KINDS) in readme
