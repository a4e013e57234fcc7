"""Router checkpoints: ``model.safetensors`` + tokenizer files + ``manifest.json``.

A checkpoint directory is self-describing: the manifest names the candidates (in slot order) and
their label tokens, the backbone, the knob range, the energy estimator (J per token and expected
output tokens per candidate), the calibration, the training-data watermark, evaluation scores and
library versions, and the SHA-256 of every file beside it (``files``), verified when the checkpoint is
loaded: a file changed or truncated after training is refused, never served. A *pointer* is a small
JSON file ``{"checkpoint": "<dir>"}`` (or a symlink to a checkpoint directory) that ``retrain`` swaps
atomically (mode 0640: readable by the proxy's group); serving watches it for hot reload.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, ValidationError

from litellm_energy_router.errors import UserError, one_line, replacing

FORMAT = "energy-router-checkpoint/1"
MANIFEST = "manifest.json"


class CheckpointError(UserError, ValueError):
    """A checkpoint cannot be used; the message is one line naming the path and the problem."""


class EnergyEstimate(BaseModel):
    """Ê at routing time: ``prompt_tokens * j_per_prompt_token + expected output tokens * j_per_output_token``
    (joules). Expected output tokens are learned per (task, candidate); a task the table does not hold
    (production traffic, a new task) takes the conservative per-candidate prior ``output_tokens_prior``,
    never the other tasks' mean, unless the checkpoint's length model (:mod:`.length_model`) predicts it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a NaN or negative joule would win every argmax

    j_per_prompt_token: dict[str, NonNegativeFloat]
    j_per_output_token: dict[str, NonNegativeFloat]
    output_tokens: dict[str, dict[str, NonNegativeFloat]] = Field(description="task -> candidate -> mean output tokens")
    output_tokens_any: dict[str, NonNegativeFloat] = Field(description="candidate -> mean output tokens, all tasks")
    output_tokens_prior: dict[str, NonNegativeFloat] | None = Field(
        None,
        description="candidate -> output tokens assumed for a task the table does not hold (a conservative "
        "chat-length prior, energy/profile.chat_output_tokens); None (older checkpoints): output_tokens_any",
    )
    prior_source: str | None = Field(None, description="where output_tokens_prior comes from (one line)")
    fitted_on: dict[str, dict[str, Any]] | None = Field(
        None, description="candidate -> runs it was fitted on (per source, measured) and where J/token came from"
    )

    def estimate(
        self,
        candidates: Sequence[str],
        prompt_tokens: Sequence[int],
        tasks: Sequence[str | None],
        offset_tokens: Any = None,
    ) -> Any:
        """Ê[n, K] in joules (numpy array). ``offset_tokens[n, K]``: a per-query correction of the expected
        output tokens (the checkpoint's token model, :mod:`.token_model`); the sum is floored at 0."""
        import numpy as np

        jp, jo = self.rates(candidates)
        out = np.empty((len(prompt_tokens), len(candidates)))
        fallback = self.unknown_task_tokens()
        for i, task in enumerate(tasks):
            table = self.output_tokens.get(task or "", fallback)
            out[i] = [table.get(c, fallback[c]) for c in candidates]
        if offset_tokens is not None:
            out = np.maximum(out + np.asarray(offset_tokens, dtype=float), 0.0)
        return np.asarray(prompt_tokens, dtype=float)[:, None] * jp[None, :] + out * jo[None, :]

    def rates(self, candidates: Sequence[str]) -> tuple[Any, Any]:
        """(J per prompt token, J per output token) as numpy arrays in the order of ``candidates``."""
        import numpy as np

        return tuple(np.array([j[c] for c in candidates]) for j in (self.j_per_prompt_token, self.j_per_output_token))

    def unknown_task_tokens(self) -> dict[str, float]:
        """Candidate → output tokens for a task the table does not hold: the prior (older checkpoints: the mean)."""
        return self.output_tokens_prior if self.output_tokens_prior is not None else self.output_tokens_any

    def knows_task(self, task: str | None) -> bool:
        return bool(task) and task in self.output_tokens


class Manifest(BaseModel):
    model_config = ConfigDict(extra="allow")

    format: str = FORMAT
    version: str = Field(description="checkpoint version label, e.g. a timestamp")
    candidates: list[str]
    scorer: str | None = Field(
        None, description="scorer kind serving this checkpoint (router/scoring.py); None: student if shipped, else lm"
    )
    label_tokens: dict[str, str] = Field(default_factory=dict, description="LM checkpoints: candidate -> label token")
    backbone: dict[str, Any] = Field(default_factory=dict)
    max_len: int = 0
    max_chars: int = 4096
    knob: dict[str, Any] = Field(
        default_factory=dict, description="lambda_min, lambda_max (accuracy per the settings' e_ref_j)"
    )
    energy: EnergyEstimate
    calibration: dict[str, Any] = Field(default_factory=dict)
    student: dict[str, Any] | None = Field(
        None, description="distilled student: file, features, fit, target (router/student.py)"
    )
    probe: dict[str, Any] | None = Field(None, description="probe head: file, encoder, dim (router/probe.py)")
    baseline: dict[str, Any] | None = Field(
        None, description="exported baseline: file, kind, params (router/baseline_scorers.py)"
    )
    tokens: dict[str, Any] | None = Field(
        None, description="per-query output-token model: file, CV errors (router/token_model.py)"
    )
    length: dict[str, Any] | None = Field(
        None, description="cross-task output-length model: file, fit (router/length_model.py)"
    )
    watermark: dict[str, Any] = Field(default_factory=dict)
    eval: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(
        default_factory=dict, description="file name -> SHA-256 (hex) of every file beside the manifest"
    )
    created: float = Field(default_factory=time.time)


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("litellm-energy-router", "torch", "transformers", "trl", "litellm"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def resolve(path: str | os.PathLike[str]) -> Path:
    """A checkpoint directory from a directory, a symlink or a pointer file."""
    p = Path(path)
    if p.is_file():
        try:
            target = json.loads(p.read_text())["checkpoint"]
            if not isinstance(target, str) or not target:
                raise TypeError(target)
        except (ValueError, KeyError, TypeError):
            raise CheckpointError(f'{p}: not a checkpoint pointer (expected JSON {{"checkpoint": "<dir>"}})') from None
        t = Path(target)
        return (t if t.is_absolute() else p.parent / t).resolve()
    return p.resolve()


def read_manifest(path: str | os.PathLike[str], expect_candidates: Sequence[str] | None = None) -> Manifest:
    """Read and check ``manifest.json``; refuse a wrong format or a candidate mismatch."""
    d = resolve(path)
    f = d / MANIFEST
    if not d.exists():  # a pointer naming a directory that is gone: say which file named it
        named = f" (named by {path})" if Path(path).is_file() else ""
        raise CheckpointError(f"{d}: no such checkpoint directory{named}")
    if not f.exists():
        raise CheckpointError(f"{d}: no {MANIFEST} (not a router checkpoint)")
    try:
        m = Manifest.model_validate_json(f.read_text())
    except ValidationError as e:
        raise CheckpointError(one_line(e, str(f))) from None
    except ValueError as e:
        raise CheckpointError(f"{f}: not valid JSON ({e})") from None
    if m.format != FORMAT:
        raise CheckpointError(f"{f}: format {m.format!r} is not {FORMAT!r}")
    if m.label_tokens and set(m.label_tokens) != set(m.candidates):
        raise CheckpointError(f"{f}: label_tokens do not cover candidates {m.candidates}")
    e = m.energy
    for key, per in (
        ("j_per_prompt_token", e.j_per_prompt_token),
        ("j_per_output_token", e.j_per_output_token),
        ("output_tokens_prior" if e.output_tokens_prior is not None else "output_tokens_any", e.unknown_task_tokens()),
    ):
        missing = [c for c in m.candidates if c not in per]
        if missing:
            raise CheckpointError(f"{f}: energy.{key} has no entry for candidate {missing[0]!r}")
    if expect_candidates is not None and list(expect_candidates) != list(m.candidates):
        missing = sorted(set(expect_candidates) - set(m.candidates))
        extra = sorted(set(m.candidates) - set(expect_candidates))
        raise CheckpointError(
            f"{f}: candidates do not match the pool (missing {missing}, unexpected {extra}, or another order)"
        )
    return m


def checkpoint_files(directory: Path) -> list[Path]:
    """The regular files of a checkpoint directory that its manifest hashes (top level, not hidden)."""
    return sorted(
        p
        for p in Path(directory).iterdir()
        if p.name != MANIFEST and not p.name.startswith(".") and stat.S_ISREG(p.lstat().st_mode)
    )


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """Write ``manifest.json`` with the SHA-256 of every file now in ``directory`` (write it last)."""
    manifest.files = {p.name: sha256_file(p) for p in checkpoint_files(directory)}
    (directory / MANIFEST).write_text(manifest.model_dump_json(indent=2))


def verify_files(directory: Path, manifest: Manifest) -> None:
    """Refuse (:class:`CheckpointError`, one line) a checkpoint whose files do not match the manifest's
    SHA-256 (changed, missing or added beside it). A manifest without hashes (written before they
    existed) is accepted."""
    if not manifest.files:
        return
    present = {p.name for p in checkpoint_files(directory)}
    for name in sorted(set(manifest.files) | present):
        if name not in manifest.files:
            raise CheckpointError(f"{directory / name}: not listed in the manifest (added after training)")
        if name not in present:
            raise CheckpointError(f"{directory / name}: missing (the manifest lists it)")
        if sha256_file(directory / name) != manifest.files[name]:
            raise CheckpointError(f"{directory / name}: SHA-256 does not match the manifest (changed after training)")


def part_path(directory: Path, manifest: Manifest, name: Any) -> Path:
    """The file of a part the manifest names (the student, a baseline's arrays): a plain file name in the
    checkpoint directory, one of its hashed ``files`` when the manifest has them; anything else (``../x``, an absolute
    path: a file nobody checked) is refused in one line."""
    n = str(name)
    if Path(n).name != n or n in ("", ".", "..") or (manifest.files and n not in manifest.files):
        raise CheckpointError(f"{directory}: the manifest names part file {n[:120]!r}, not one of its own files")
    return directory / n


def point_to(pointer: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str]) -> None:
    """Atomically make ``pointer`` (a JSON file) name ``checkpoint_dir``."""
    pointer = Path(pointer)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    with replacing(pointer) as tmp, open(tmp, "w") as fh:  # a full disk: the pointer stays as it was
        json.dump({"checkpoint": str(Path(checkpoint_dir).resolve())}, fh)
        fh.flush()
        os.fchmod(fh.fileno(), 0o640)  # the proxy may run as another user of the group
        os.fsync(fh.fileno())
