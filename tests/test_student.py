"""The distilled student shipped in a checkpoint: loading, fallback to the LM, numpy reference."""

from __future__ import annotations

import json
import shutil
import zlib

import numpy as np
import pytest

from litellm_energy_router.router.checkpoint import CheckpointError
from litellm_energy_router.router.decide import DEFAULT_E_REF_J, decide_lambda
from litellm_energy_router.router.model import RouterModel
from litellm_energy_router.router.scoring import scores_from_logits
from litellm_energy_router.router.student import STUDENT_FILE, Student, ngram_buckets

TEXTS = ["Give a proof about chess number 7", "Tell me about rivers number 8", "", "Ünïcödé ✓ \ud800 proof", "a" * 5000]


def _reference_buckets(text: str, ngrams, dim: int, tail: int) -> np.ndarray:
    """Plain-Python twin of ngram_buckets (the documented hash, one n-gram at a time)."""
    b = text[-tail:].lower().encode("utf-8", "replace")
    out = set()
    for n in ngrams:
        for i in range(len(b) - n + 1):
            h = 2 * 257 + b[i]
            for c in b[i + 1 : i + n]:
                h = (h * 257 + c) % 2**64
            out.add((((h * 0x9E3779B1) % 2**64) >> 16) % dim)
    return np.array(sorted(out), dtype=np.int64)


@pytest.mark.parametrize("ngrams,dim,tail", [((2, 3, 4), 1 << 16, 1024), ((3, 5), 1 << 10, 64), ((2, 3), 1 << 17, 256)])
def test_ngram_buckets_match_the_reference(ngrams, dim, tail):
    for t in TEXTS + ["x", "ab", "abc"]:
        np.testing.assert_array_equal(ngram_buckets(t, ngrams, dim, tail), _reference_buckets(t, ngrams, dim, tail))


def test_one_pass_serves_every_tail():
    """A shorter tail of a text already hashed reads the shared pass's suffix: the same buckets as its own pass
    (ASCII, non-ASCII, a text shorter than either tail; the order of the calls does not matter)."""
    from litellm_energy_router.router import student

    for t in TEXTS + ["Σ" * 700 + "ab" * 400, "short", "x" * 1000 + "Σ"]:
        for first, second in (
            (((2, 3, 4), 1 << 16, 1024), ((3, 4), 1 << 12, 600)),
            (((3, 4), 1 << 12, 600), ((2, 3, 4), 1 << 16, 1024)),
        ):
            student._hashes.cache_clear()
            student._suffix_buckets.cache_clear()
            for ngrams, dim, tail in (first, second):
                np.testing.assert_array_equal(
                    ngram_buckets(t, ngrams, dim, tail), _reference_buckets(t, ngrams, dim, tail)
                )


def test_checkpoint_ships_the_student_and_serving_uses_it(planted_ckpt):
    m = RouterModel(planted_ckpt)
    assert m.manifest.student and m.manifest.student["file"] == STUDENT_FILE
    assert m.scorer_name == "student"
    st = Student.load(planted_ckpt / STUDENT_FILE)
    tasks = [None, "synthetic", None, None, "unseen-task"]
    z = np.zeros((len(TEXTS), len(m.candidates)))
    for i, (t, task) in enumerate(zip(TEXTS, tasks)):  # numpy reference of the student's forward
        idx = _reference_buckets(t, st.ngrams, st.dim, st.tail_chars)
        z[i] = st.W[idx].sum(axis=0) / np.sqrt(max(len(idx), 1)) + st.b
        if task in st.tasks:
            z[i] += st.W_task[st.tasks[task]]
    # the student was distilled on the router's calibrated logits (probe head included): no calibration on top
    assert m.manifest.student["target"] == "calibrated_logit" and m.student_is_final
    P_ref = 1.0 / (1.0 + np.exp(-z))
    P = m.score(TEXTS, tasks)
    np.testing.assert_allclose(P, P_ref, atol=1e-6)
    E = m.energy(TEXTS, tasks)
    e_ref = DEFAULT_E_REF_J
    for lam in (0.0, 0.05, 0.5, 5.0):
        np.testing.assert_array_equal(decide_lambda(P, E, lam, e_ref), decide_lambda(P_ref, E, lam, e_ref))


def test_student_learns_the_planted_rule(planted_ckpt):
    m = RouterModel(planted_ckpt)
    texts = [f"Give a proof about bread number {i}" for i in range(100, 110)] + [
        f"Tell me about glass number {i}" for i in range(100, 110)
    ]
    P = m.score(texts)
    large = m.candidates.index("large")
    small = m.candidates.index("small")
    assert P[:10, small].mean() < 0.5 < P[10:, small].mean()
    assert P[:10, large].mean() > 0.5


def _copy(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("_trainer*"))
    return dst


def test_manifest_without_student_falls_back_to_the_lm(planted_ckpt, tmp_path):
    d = _copy(planted_ckpt, tmp_path / "nostudent")
    man = json.loads((d / "manifest.json").read_text())
    man.pop("student")
    (d / "manifest.json").write_text(json.dumps(man))
    (d / STUDENT_FILE).unlink()
    m = RouterModel(d)
    assert m.student is None and m.scorer_name in ("lm-fast", "lm")
    np.testing.assert_allclose(m.score(TEXTS), RouterModel(planted_ckpt, scorer="lm").score(TEXTS), atol=1e-6)
    lm = RouterModel(planted_ckpt, scorer="lm")
    assert lm.student is None and lm.scorer_name == "lm-fast"


def test_broken_student_is_refused(planted_ckpt, tmp_path):
    d = _copy(planted_ckpt, tmp_path / "broken")
    (d / STUDENT_FILE).write_bytes(zlib.compress(b"not an npz"))
    with pytest.raises(CheckpointError, match="student"):
        RouterModel(d)
    assert RouterModel(d, scorer="lm").scorer_name == "lm-fast"  # the LM alone still loads


def test_lm_scorer_adds_the_slot_logits_to_the_probe_head(planted_ckpt, tmp_path):
    from litellm_energy_router.router.encoder import MiniLMEmbedder, query_block
    from litellm_energy_router.router.probe import PROBE_FILE, Probe

    lm = RouterModel(planted_ckpt, scorer="lm")
    assert lm.manifest.probe["file"] == PROBE_FILE and lm.manifest.calibration.get("offset") == "probe"
    probe = Probe.load(planted_ckpt / PROBE_FILE)
    tasks = [None, "synthetic", None, None, "unseen-task"]
    emb = MiniLMEmbedder().embed([query_block(t) for t in TEXTS])
    q = probe.logits(emb, tasks)
    z = lm.slot_logits(TEXTS, tasks)
    np.testing.assert_allclose(
        lm.score(TEXTS, tasks), scores_from_logits(z, lm.manifest.calibration, tasks, offset=q), atol=1e-6
    )
    assert np.abs(q).max() > 0  # the probe learned something from the planted rows
    d = _copy(planted_ckpt, tmp_path / "badprobe")
    (d / PROBE_FILE).write_bytes(b"not an npz")
    with pytest.raises(CheckpointError, match="probe"):
        RouterModel(d, scorer="lm")


def test_shared_rows_sum_each_table_bit_for_bit():
    """One gather of two tables gives each table's own row sums, bit for bit (float32 values held as float64)."""
    from litellm_energy_router.router.student import SharedRows, row_sum

    rng = np.random.default_rng(0)
    A = np.asarray(rng.standard_normal((4096, 6)).astype(np.float32), dtype=np.float64)
    B = rng.standard_normal((4096, 5)).astype(np.float32)
    shared = SharedRows(A, B)
    part_a, part_b = shared.part(0), shared.part(1)
    for n in (0, 1, 7, 600, 2000, 4096):
        idx = np.sort(rng.choice(4096, size=n, replace=False)).astype(np.intp)
        np.testing.assert_array_equal(part_a(idx), row_sum(A, idx))
        np.testing.assert_array_equal(part_b(idx), row_sum(B, idx))
        assert part_a(idx.copy()).shape == (6,)  # another array with the same ids: summed again, same sums


def test_a_student_on_the_length_buckets_shares_one_gather(planted_ckpt):
    """A student that reads the length model's buckets (the training default) sums its rows and the length model's
    in one gather; P and Ê are those of two separate gathers, bit for bit."""
    from functools import partial

    from litellm_energy_router.router import length_model as lm
    from litellm_energy_router.router.student import row_sum

    m = RouterModel(planted_ckpt)
    st, L = m.student, m.length
    assert st.reads(lm.NGRAMS, lm.DIM, lm.TAIL_CHARS) and L is not None and L.W is not None
    assert not isinstance(st.rows, partial) and not isinstance(L.rows, partial)  # parts of one SharedRows
    texts = TEXTS + [f"Write a function number {i}, in 200 words" for i in range(5)]
    P, E = m.score(texts), m.energy(texts)
    st.rows, L.rows = partial(row_sum, st.W), partial(row_sum, L.W)
    np.testing.assert_array_equal(P, m.score(texts))
    np.testing.assert_array_equal(E, m.energy(texts))
