"""``energy-router train`` and ``energy-router route``."""

from __future__ import annotations

import ast
import csv
import json
import time
from pathlib import Path
from typing import Optional

import typer

from . import ConfigOpt, DbOpt, console, db_url, fail
from .table_cmds import _store, progress_bar

ROUTE_COLUMNS = ("Unnamed: 0", "sample_id", "prompt", "eval_name")


def train_cmd(
    out: Path = typer.Option(..., "--out", help="checkpoint directory to write"),
    db: Optional[str] = DbOpt,
    config: Optional[Path] = ConfigOpt,
    backbone: str = typer.Option("tiny", "--backbone", help="tiny | minilm | hf:<model id or path>"),
    quick: bool = typer.Option(False, "--quick", help="seconds-long run for tests and smoke checks"),
    epochs: Optional[float] = typer.Option(None, "--epochs", help="SFT epochs (default from TrainConfig)"),
    candidates: Optional[str] = typer.Option(None, "--candidates", help="comma-separated, slot order (default: all, cheapest first)"),
    grpo_steps: int = typer.Option(0, "--grpo-steps", help="GRPO steps after SFT (0 = off, the default)"),
    probe_c: Optional[float] = typer.Option(None, "--probe-c", min=0,
                                            help="probe head's inverse L2 strength (default from TrainConfig); 0 = no probe, the LM alone"),  # fmt: skip
    scorer: str = typer.Option("lm", "--scorer", help="lm (the LM router and its student) or a baseline to serve: task_prior, knn, logreg"),
) -> None:
    """Train the LM router from the table (TRL SFT, probe head, calibration, student) and write a checkpoint;
    with ``--scorer task_prior|knn|logreg``, fit that baseline instead and write it as a servable checkpoint."""
    from ..training.backbones import BackboneSpec
    from ..training.pipeline import TrainConfig, TrainingDataError, train

    if scorer != "lm":
        return _export_baseline_cmd(scorer, out, db_url(db, config), candidates)

    cfg = TrainConfig.quick() if quick else TrainConfig()
    if backbone != cfg.backbone.name:
        cfg.backbone = BackboneSpec(name=backbone)
    if epochs is not None:
        cfg.sft.epochs = epochs
    if grpo_steps > 0:
        from ..training.grpo import GRPOStageConfig

        cfg.grpo = GRPOStageConfig(steps=grpo_steps)
    if candidates:
        cfg.candidates = [c.strip() for c in candidates.split(",") if c.strip()]
    if probe_c is not None:
        cfg.probe_c = probe_c or None
    t0 = time.time()
    with _store(db_url(db, config)) as store, progress_bar() as bar:
        task = bar.add_task("SFT", total=None)

        def on_step(d: dict) -> None:
            bar.update(task, total=d.get("max_steps"), completed=d.get("step", 0),
                       description=f"SFT loss {d.get('loss', float('nan')):.3f}" if "loss" in d else "SFT")  # fmt: skip

        try:
            ck = train(store, out, cfg, log=lambda s: console.print(s, highlight=False), on_step=on_step)
        except (TrainingDataError, ValueError) as e:
            fail(str(e))
    console.print(f"trained {ck} in {time.time() - t0:.0f}s", highlight=False)


def _export_baseline_cmd(kind: str, out: Path, url: str, candidates: str | None) -> None:
    from ..router.baseline_scorers import BASELINE_KINDS
    from ..training.baselines import export_baseline
    from ..training.data import load_matrix

    if kind not in BASELINE_KINDS:
        fail(f"--scorer {kind!r}: use lm or one of {', '.join(BASELINE_KINDS)}")
    t0 = time.time()
    with _store(url) as store:
        cands = [c.strip() for c in candidates.split(",") if c.strip()] if candidates else None
        try:
            ck = export_baseline(kind, load_matrix(store, cands), out)
        except ValueError as e:
            fail(str(e))
    console.print(f"{kind} checkpoint {ck} in {time.time() - t0:.0f}s", highlight=False)


def _read_route_input(path: Path) -> list[tuple[str, str, str]]:
    """(row key, eval_name, prompt text) per row. Only the routing columns are ever read."""
    import gzip
    import io

    if not path.exists():
        fail(f"{path}: file not found")
    csv.field_size_limit(1 << 30)
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    with io.TextIOWrapper(raw, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None) or []
        if "prompt" not in header:
            fail(f"{path}: missing column 'prompt' (need {', '.join(ROUTE_COLUMNS)})")
        key_i = next((header.index(k) for k in ("Unnamed: 0", "") if k in header), None)
        p_i = header.index("prompt")
        t_i = header.index("eval_name") if "eval_name" in header else None
        rows = []
        for n, rec in enumerate(reader, start=2):
            key = rec[key_i] if key_i is not None else str(n - 2)
            try:
                parts = ast.literal_eval(rec[p_i])
            except (ValueError, SyntaxError, IndexError):
                fail(f"{path}:{n}: column 'prompt': not a Python list literal")
            text = "".join(parts) if isinstance(parts, list) else str(parts)
            rows.append((key, rec[t_i] if t_i is not None else None, text))
    return rows


def route_cmd(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="checkpoint directory or pointer file"),
    input: Path = typer.Option(..., "--input", help="RouterBench-format CSV (Unnamed: 0, sample_id, prompt, eval_name)"),
    output: Path = typer.Option(..., "--output", help="decisions.jsonl"),
    lambdas: Optional[str] = typer.Option(None, "--lambda", help="comma-separated λ values"),
    sweep: Optional[int] = typer.Option(None, "--sweep", help="N operating points spanning this input's curve: λ at the "
                                        "breakpoints of its decisions, from the most accurate choice to the cheapest"),
    target_accuracy: Optional[float] = typer.Option(None, "--target-accuracy", help="cheapest candidate predicted >= X"),
    scorer: str = typer.Option("auto", "--scorer", help="auto (the checkpoint's own, as serving), student, lm, or another registered kind"),
) -> None:
    """Batch routing: one JSON line per (row, operating point). λ in accuracy per 100 J (knob.e_ref_j)."""
    from ..router.checkpoint import CheckpointError
    from ..router.decide import DEFAULT_E_REF_J, lambda_grid
    from ..router.scoring import load_scorer

    try:
        router = load_scorer(checkpoint, scorer)
    except CheckpointError as e:
        fail(str(e))
    rows = _read_route_input(input)
    points: list[tuple[str, float | None]] = []
    if lambdas:
        try:
            points += [("lambda", float(x)) for x in lambdas.split(",") if x.strip()]
        except ValueError:
            fail(f"--lambda {lambdas!r}: not a comma-separated list of numbers")
    t0 = time.time()
    texts = [r[2] for r in rows]
    tasks = [r[1] for r in rows]
    P = router.score(texts, tasks)
    E = router.energy(texts, tasks)
    if sweep:  # the input's own breakpoints (the checkpoint's knob range can stop short of an unseen task's cheap end)
        points += [("lambda", float(x)) for x in lambda_grid(P, E, DEFAULT_E_REF_J, sweep)]
    if target_accuracy is not None:
        points.append(("target", target_accuracy))
    if not points:
        points = [("lambda", 0.0)]
    cands = router.candidates
    with open(output, "w", encoding="utf-8") as fh:
        for kind, val in points:
            choice = router.decide(P, E, lam=val) if kind == "lambda" else router.decide(P, E, target=val)
            for i, (key, task, _) in enumerate(rows):
                rec = {"row": int(key) if key.isdigit() else key, "eval_name": task, "model": cands[int(choice[i])],
                       kind if kind == "lambda" else "target_accuracy": val,
                       "scores": {c: round(float(p), 6) for c, p in zip(cands, P[i])},
                       "energy_j": {c: round(float(e), 4) for c, e in zip(cands, E[i])}}  # fmt: skip
                fh.write(json.dumps(rec) + "\n")
    dt = time.time() - t0
    console.print(f"routed {len(rows)} rows x {len(points)} operating points -> {output} "
                  f"({len(rows) / max(dt, 1e-9):.0f} queries/s)", highlight=False)  # fmt: skip
