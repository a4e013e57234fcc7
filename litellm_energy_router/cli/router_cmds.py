"""``energy-router train`` and ``energy-router route``."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import typer

from litellm_energy_router.cli.common import (
    ConfigOpt,
    DbOpt,
    console,
    db_url,
    fail,
    settings_or_fail,
)
from litellm_energy_router.cli.route_input import FORMATS_HELP, read_route_input
from litellm_energy_router.cli.table_cmds import _store, progress_bar
from litellm_energy_router.errors import replacing


def _builtin_trainable() -> list[str]:
    """The built-in trainable scorer kinds besides ``lm``/``student``, read from the registry's plugin."""
    from litellm_energy_router.router.builtin_scorers import energy_router_scorers

    return [n for n, s in energy_router_scorers().items() if s.fit is not None and n not in ("lm", "student")]


def train_cmd(
    out: Path = typer.Option(..., "--out", help="checkpoint directory to write"),
    db: Optional[str] = DbOpt,
    config: Optional[Path] = ConfigOpt,
    backbone: Optional[str] = typer.Option(
        None, "--backbone", help="tiny | minilm | hf:<model id or path> (default from TrainConfig)"
    ),
    quick: bool = typer.Option(
        False,
        "--quick",
        help="a short run (tiny backbone, few steps: about two minutes on 2 cores) for tests and smoke checks",
    ),
    epochs: Optional[float] = typer.Option(None, "--epochs", help="SFT epochs (default from TrainConfig)"),
    candidates: Optional[str] = typer.Option(
        None, "--candidates", help="comma-separated, slot order (default: all, cheapest first)"
    ),
    grpo_steps: int = typer.Option(0, "--grpo-steps", min=0, help="GRPO steps after SFT (0 = off, the default)"),
    probe_c: Optional[float] = typer.Option(
        None,
        "--probe-c",
        min=0,
        help="probe head's inverse L2 strength (default from TrainConfig); 0 = no probe, the LM alone",
    ),
    scorer: str = typer.Option(
        "lm",
        "--scorer",
        help="lm (the LM router and its student) or another trainable scorer kind of the registry "
        f"({', '.join(_builtin_trainable())} or a plugin's)",
    ),
) -> None:
    """Train the LM router from the table (TRL SFT, probe head, calibration, student) and write a checkpoint;
    with ``--scorer KIND``, fit that registered scorer instead and write it as a servable checkpoint."""
    out = _checked_out(out)
    if scorer != "lm":
        return _export_baseline_cmd(scorer, out, db_url(db, config), candidates)

    cfg = _train_config(quick, backbone, epochs, grpo_steps, candidates, probe_c)
    t0 = time.time()
    ck = _train_with_progress(db_url(db, config), out, cfg)
    console.print(f"trained {ck} in {time.time() - t0:.0f}s", highlight=False)


def _train_config(
    quick: bool,
    backbone: Optional[str],
    epochs: Optional[float],
    grpo_steps: int,
    candidates: Optional[str],
    probe_c: Optional[float],
) -> Any:
    """The :class:`~litellm_energy_router.training.pipeline.TrainConfig` of ``train``: the default (or quick)
    one with the command-line options over it."""
    from litellm_energy_router.training.backbones import BackboneSpec, check_backbone_name
    from litellm_energy_router.training.pipeline import TrainConfig

    cfg = TrainConfig.quick() if quick else TrainConfig()
    if backbone is not None and backbone != cfg.backbone.name:
        try:
            cfg.backbone = BackboneSpec(name=check_backbone_name(backbone))
        except ValueError as e:
            fail(f"--backbone: {e}")
    if epochs is not None:
        if not (math.isfinite(epochs) and epochs > 0):
            fail(f"--epochs {epochs!r}: must be a number > 0")
        cfg.sft.epochs = epochs
    if grpo_steps > 0:
        from litellm_energy_router.training.grpo import GRPOStageConfig

        cfg.grpo = GRPOStageConfig(steps=grpo_steps)
    if candidates:
        cfg.candidates = [c.strip() for c in candidates.split(",") if c.strip()]
    if probe_c is not None:
        cfg.probe_c = probe_c or None
    return cfg


def _train_with_progress(url: str, out: Path, cfg: Any) -> Any:
    """Train on the table at ``url`` into ``out`` with an SFT progress bar; returns the checkpoint."""
    from litellm_energy_router.training.pipeline import TrainingDataError, train

    with _store(url, create=False) as store, progress_bar() as bar:
        task = bar.add_task("SFT", total=None)

        def on_step(d: dict) -> None:
            bar.update(
                task,
                total=d.get("max_steps"),
                completed=d.get("step", 0),
                description=f"SFT loss {d.get('loss', float('nan')):.3f}" if "loss" in d else "SFT",
            )

        # written beside ``out`` and swapped in at the end: a run killed half way (or refused) leaves the
        # checkpoint that was there, which serving may use, whole
        _remove_dead_runs(out)
        with replacing(out) as tmp:
            try:
                train(store, tmp, cfg, log=_log_as(tmp, out), on_step=on_step)
            except (TrainingDataError, ValueError) as e:
                fail(str(e))
    return out


def _checked_out(out: Path) -> Path:
    """``--out`` as an absolute path; refused (exit 2) when what is there is not a checkpoint (a directory holding a
    ``manifest.json``) or an empty directory: training replaces it whole (a directory of other files, the table's
    own SQLite file)."""
    out = Path(os.path.abspath(out))
    if not out.name:
        fail(f"--out {out}: not a directory a checkpoint can be written as")
    if out.is_symlink() or not out.exists():
        return out
    if out.is_dir() and ((out / "manifest.json").is_file() or not any(out.iterdir())):
        return out
    fail(f"--out {out}: exists and is not a checkpoint (no manifest.json); training replaces it whole: choose another")
    return out


def _log_as(tmp: Path, out: Path) -> Any:
    """A log that names ``out`` where the training names the directory it writes (``tmp``, swapped in at the end)."""
    return lambda s: console.print(str(s).replace(str(tmp), str(out)), highlight=False)


def _remove_dead_runs(out: Path) -> None:
    """Remove what runs into ``out`` that were killed left beside it (``.<name>.tmp-<pid>``, :func:`.errors.replacing`'s
    temporary, its pid gone)."""
    for d in out.parent.glob(f".{out.name}.tmp-*"):
        pid = d.name.rsplit("-", 1)[-1]
        try:
            if pid.isdigit() and int(pid) != os.getpid():
                os.kill(int(pid), 0)
                continue  # another run, still going
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # alive, another user's
        shutil.rmtree(d, ignore_errors=True)


def _export_baseline_cmd(kind: str, out: Path, url: str, candidates: str | None) -> None:
    from litellm_energy_router.plugins import scorer_specs
    from litellm_energy_router.training.baselines import export_baseline
    from litellm_energy_router.training.data import load_matrix

    specs = {n: s for n, s in scorer_specs().items() if s.fit is not None and n != "lm"}
    if kind not in specs:
        fail(f"--scorer {kind!r}: use lm or one of {', '.join(specs)}")
    t0 = time.time()
    with _store(url, create=False) as store:
        cands = [c.strip() for c in candidates.split(",") if c.strip()] if candidates else None
        _remove_dead_runs(out)
        with replacing(out) as tmp:  # written beside it and swapped in, as the LM's
            try:
                m = load_matrix(store, cands)
                console.print(  # the fit prints nothing for tens of seconds (kNN and logreg embed every query first)
                    f"fitting {kind} on {len(m)} queries x {len(m.candidates)} candidates...", highlight=False
                )
                (specs[kind].export or export_baseline)(kind, m, tmp)
            except ValueError as e:
                fail(str(e))
    console.print(f"{kind} checkpoint {out} in {time.time() - t0:.0f}s", highlight=False)


def route_points(
    base: Any,
    P: Any,
    E: Any,
    lambdas: Sequence[float] = (),
    sweep: int | None = None,
    target_accuracy: float | None = None,
) -> list[tuple[str, float, Any]]:
    """(kind, value, :class:`~litellm_energy_router.knob.Knob`) per operating point: ``base`` (the settings'
    knob: ``e_ref_j``, ``max_energy_j``) with λ (``--lambda``, ``--sweep`` points spread over where the
    decisions on ``P``/``E`` switch) or a target accuracy; the settings' own knob when none is asked for."""
    from litellm_energy_router.router.decide import lambda_grid

    lams = [float(x) for x in lambdas]
    if sweep:
        lams += [float(x) for x in lambda_grid(P, E, base.e_ref_j, sweep)]
    points = [("lambda", lam, base.model_copy(update={"lambda_": lam, "target_accuracy": None})) for lam in lams]
    if target_accuracy is not None:
        points.append(
            ("target_accuracy", target_accuracy, base.model_copy(update={"target_accuracy": target_accuracy}))
        )
    if not points:
        kind, val = (
            ("target_accuracy", base.target_accuracy) if base.target_accuracy is not None else ("lambda", base.lambda_)
        )
        points = [(kind, val, base)]
    return points


def route_cmd(
    checkpoint: Path = typer.Option(..., "--checkpoint", exists=True, help="checkpoint directory or pointer file"),
    input: Path = typer.Option(..., "--input", exists=True, dir_okay=False, help=FORMATS_HELP),
    output: Path = typer.Option(..., "--output", help="decisions.jsonl"),
    lambdas: Optional[str] = typer.Option(None, "--lambda", help="comma-separated λ values"),
    sweep: Optional[int] = typer.Option(
        None,
        "--sweep",
        min=1,
        help="N operating points spanning this input's curve: λ at the "
        "breakpoints of its decisions, from the most accurate choice to the cheapest",
    ),
    target_accuracy: Optional[float] = typer.Option(
        None, "--target-accuracy", min=0, max=1, help="cheapest candidate predicted >= X"
    ),
    scorer: str = typer.Option(
        "auto", "--scorer", help="auto (the checkpoint's own, as serving), student, lm, or another registered kind"
    ),
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Batch routing: one JSON line per (row, operating point), decided as serving decides (the settings'
    knob: λ in accuracy per ``knob.e_ref_j`` J, ``knob.max_energy_j``; ``--lambda``/``--target-accuracy``
    replace its λ / target)."""
    from litellm_energy_router.router.checkpoint import CheckpointError
    from litellm_energy_router.router.scoring import load_scorer

    try:
        lams = [float(x) for x in lambdas.split(",") if x.strip()] if lambdas else []
    except ValueError:
        fail(f"--lambda {lambdas!r}: not a comma-separated list of numbers")
    bad = next((x for x in lams if not (math.isfinite(x) and x >= 0)), None)
    if bad is not None:
        fail(f"--lambda {bad!r}: must be a finite number >= 0 (accuracy per knob.e_ref_j joules)")
    if output.exists() and output.resolve() == input.resolve():
        fail(
            f"--output {output}: is the --input file (its prompts would be overwritten); write the decisions elsewhere"
        )
    base = settings_or_fail(config).knob.base()
    try:
        router = load_scorer(checkpoint, scorer)
    except CheckpointError as e:
        fail(str(e))
    rows = read_route_input(input)
    t0 = time.time()
    texts = [r[2] for r in rows]
    tasks = [r[1] for r in rows]
    P = router.score(texts, tasks)
    E = router.energy(texts, tasks)
    cands = router.candidates
    # --sweep: the input's own breakpoints (a checkpoint's knob range can stop short of an unseen task's cheap end)
    points = route_points(base, P, E, lams, sweep, target_accuracy)
    _write_decisions(output, rows, points, P, E, cands)
    dt = time.time() - t0
    console.print(
        f"routed {len(rows)} rows x {len(points)} operating points -> {output} "
        f"({len(rows) / max(dt, 1e-9):.0f} queries/s)",
        highlight=False,
    )


def _write_decisions(
    output: Path, rows: list, points: list[tuple[str, float, Any]], P: Any, E: Any, cands: Any
) -> None:
    """``decisions.jsonl``: one JSON line per (operating point, row): the chosen model, the knob value and
    every candidate's predicted score and joules."""
    from litellm_energy_router.router.decide import decide

    with replacing(output) as tmp, open(tmp, "w", encoding="utf-8") as fh:  # a failed run leaves an earlier file whole
        for kind, val, knob in points:
            choice = decide(P, E, knob)
            for i, (key, task, _) in enumerate(rows):
                rec = {
                    "row": int(key) if key.isdigit() else key,
                    "eval_name": task,
                    "model": cands[int(choice[i])],
                    kind: val,
                    **({} if knob.max_energy_j is None else {"max_energy_j": knob.max_energy_j}),
                    "scores": {c: round(float(p), 6) for c, p in zip(cands, P[i])},
                    "energy_j": {c: round(float(e), 4) for c, e in zip(cands, E[i])},
                }
                fh.write(json.dumps(rec) + "\n")
