"""Checkpoints (issue: trust in production, item 7): a file changed after training is refused and never
served; the pointer is readable by the proxy's group; a refused checkpoint is retried once its files
change back."""

from __future__ import annotations

import json
import os
import shutil
import stat

import numpy as np
import pytest

from litellm_energy_router.router.checkpoint import CheckpointError, point_to
from litellm_energy_router.router.runtime import RouterRuntime
from litellm_energy_router.router.scoring import load_scorer


def _tamper_student(d):
    """Same file name and size, other weights: a valid npz a plain mtime/size check would accept."""
    z = dict(np.load(d / "student.npz"))
    z["W"] = -z["W"]
    np.savez(d / "student.npz", **z)


def test_manifest_hashes_every_file_and_a_changed_file_is_refused(planted_ckpt, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(planted_ckpt, d)
    m = json.loads((d / "manifest.json").read_text())
    assert {"student.npz", "model.safetensors", "probe.npz"} <= set(m["files"]) and all(
        len(h) == 64 for h in m["files"].values()
    )
    _tamper_student(d)
    with pytest.raises(CheckpointError, match=r"student.npz: SHA-256 does not match"):
        load_scorer(d)
    shutil.copy(planted_ckpt / "student.npz", d / "student.npz")
    (d / "extra.pth").write_text("import os")
    with pytest.raises(CheckpointError, match=r"extra.pth: not listed in the manifest"):
        load_scorer(d)


def test_pointer_is_group_readable(planted_ckpt, tmp_path):
    old = os.umask(0o077)
    try:
        point_to(tmp_path / "current.json", planted_ckpt)
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "current.json").stat().st_mode)
    assert mode & stat.S_IRGRP and not mode & stat.S_IWOTH and not mode & stat.S_IROTH


def test_refused_checkpoint_is_retried_when_its_files_change(planted_ckpt, tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    shutil.copytree(planted_ckpt, good)
    shutil.copytree(planted_ckpt, bad)
    m = json.loads((bad / "manifest.json").read_text())
    (bad / "manifest.json").write_text(json.dumps({**m, "version": "v-bad"}))  # manifest edited: its hashes still hold
    _tamper_student(bad)
    ptr = tmp_path / "current.json"
    point_to(ptr, good)
    rt = RouterRuntime(ptr, poll_s=0.0)
    first = rt.version
    point_to(ptr, bad)
    rt.maybe_reload(block=True)
    assert rt.version == first and "SHA-256" in rt.last_error  # refused; the good one keeps serving
    shutil.copy(planted_ckpt / "student.npz", bad / "student.npz")  # the operator fixes the file, same directory
    rt.maybe_reload(block=True)
    assert rt.version == "v-bad" and rt.last_error is None


@pytest.mark.parametrize("value", ["NaN", "-1e6", "Infinity"])
def test_a_manifest_with_a_non_finite_or_negative_energy_is_refused(planted_ckpt, tmp_path, value):
    """Ê from a manifest's J per token: a NaN wins every argmax and a negative figure makes energy a reward, so
    such a checkpoint is refused (one line naming the field), never hot-reloaded."""
    d = tmp_path / "ck"
    shutil.copytree(planted_ckpt, d)
    text = (d / "manifest.json").read_text()
    m = json.loads(text)
    cand = next(iter(m["energy"]["j_per_output_token"]))
    m["energy"]["j_per_output_token"][cand] = "__X__"
    (d / "manifest.json").write_text(json.dumps(m).replace('"__X__"', value))
    with pytest.raises(CheckpointError) as e:
        load_scorer(d)
    assert "j_per_output_token" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("target", [None, 5, "", ["x"]])
def test_a_pointer_naming_no_directory_is_a_checkpoint_error(tmp_path, target):
    """A pointer file whose "checkpoint" is not a path is refused in one line (a TypeError had failed every
    request open while a good model was loaded, and `retrain` printed a traceback)."""
    from litellm_energy_router.router.checkpoint import resolve

    p = tmp_path / "current.json"
    p.write_text(json.dumps({"checkpoint": target}))
    with pytest.raises(CheckpointError, match="not a checkpoint pointer"):
        resolve(p)


def test_train_killed_half_way_leaves_the_checkpoint_that_was_there(planted_ckpt, tmp_path):
    """`energy-router train --out DIR` over an existing checkpoint (maybe the one serving uses) writes beside it and
    swaps the new one in at the end: killed while training, DIR is still the old checkpoint, whole (it was rewritten
    in place, file by file, and refused by its own hashes)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = tmp_path / "ck"
    shutil.copytree(planted_ckpt, out)
    db = f"sqlite:///{planted_ckpt.parent / 't.db'}"
    exe = str(Path(sys.executable).with_name("energy-router"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    p = subprocess.Popen(
        [exe, "train", "--out", str(out), "--db", db, "--quick"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        tmp = list(tmp_path.glob(".ck.tmp-*"))
        if tmp and any(f.is_file() for f in tmp[0].rglob("*")):  # the new checkpoint's first files are written
            break
        time.sleep(0.05)
    assert p.poll() is None, "training ended before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait(30)
    assert load_scorer(out) is not None  # the old checkpoint: every file matches its manifest
    assert json.loads((out / "manifest.json").read_text()) == json.loads((planted_ckpt / "manifest.json").read_text())
    left = list(tmp_path.glob(".ck.tmp-*"))
    assert left  # the killed run's directory; the next run into DIR removes it
    r = subprocess.run(
        [exe, "train", "--out", str(out), "--db", db, "--quick"], env=env, capture_output=True, timeout=300
    )
    assert r.returncode == 0 and not list(tmp_path.glob(".ck.tmp-*")) and load_scorer(out) is not None


@pytest.mark.parametrize("name", ["../other/student.npz", "/etc/passwd", "sub/student.npz", "nothashed.npz"])
def test_a_part_file_outside_the_hashed_files_is_refused(planted_ckpt, tmp_path, name):
    """The manifest names its student's file: a name outside the checkpoint's own hashed files (a path elsewhere, a
    file nobody checked) is refused, never loaded."""
    d = tmp_path / "ck"
    shutil.copytree(planted_ckpt, d)
    (tmp_path / "other").mkdir()
    shutil.copy(d / "student.npz", tmp_path / "other" / "student.npz")
    m = json.loads((d / "manifest.json").read_text())
    m["student"]["file"] = name
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="not one of its own files"):
        load_scorer(d, kind="student")
