"""The cross-task output-length model: a rule learned across tasks carries to a task the table never held,
``max_tokens`` bounds the estimate, and an unknown task never inherits another task's mean length."""

from __future__ import annotations

import numpy as np
from litellm_energy_router.training.data import TableMatrix
from litellm_energy_router.training.length_fit import fit_length_model

from litellm_energy_router.router.checkpoint import EnergyEstimate
from litellm_energy_router.router.length_model import LengthModel
from litellm_energy_router.router.output_tokens import bounded_energy, request_max_tokens, request_tokens

WORDS = "apple river stone cloud music paper light garden window engine forest yellow".split()


def _planted(n: int = 240, seed: int = 0) -> TableMatrix:
    """Three tasks; in each, half the queries ask for code (≈300 output tokens), half for a letter (≈2)."""
    rng = np.random.default_rng(seed)
    code = np.arange(n) % 2 == 0
    topic = lambda: " ".join(rng.choice(WORDS, size=5))  # noqa: E731
    texts = [
        f"Task {i % 3}: write a function that sorts the {topic()}."
        if c
        else f"Task {i % 3}: which is heavier, the {topic()}?\nA) one\nB) two\nAnswer with the letter."
        for i, c in enumerate(code)
    ]
    T = np.where(code[:, None], 300.0, 2.0) * np.exp(rng.normal(0, 0.1, (n, 2)))
    return TableMatrix(
        candidates=["a", "b"],
        ids=np.array([f"q{i}" for i in range(n)], dtype=object),
        tasks=np.array([f"t{i % 3}" for i in range(n)], dtype=object),
        texts=texts,
        prompt_tokens=np.full(n, 20.0),
        Y=np.ones((n, 2)),
        E=T * 0.1,
        T=T,
    )


def test_learns_a_planted_rule_across_tasks_and_serves_it_from_its_file(tmp_path):
    m = _planted()
    lm, info = fit_length_model(m.subset(np.flatnonzero(m.tasks != "t2")))  # t2 is never seen
    assert "code" in info["cues_seen"] and "choice" in info["cues_seen"]
    lm.save(tmp_path / "length.npz")
    served = LengthModel.load(tmp_path / "length.npz")
    held = m.subset(np.flatnonzero(m.tasks == "t2"))
    pred = served.predict(held.texts, held.prompt_tokens)
    code = np.array(["function" in t for t in held.texts])
    assert (pred.weight == 1.0).all()  # a seen cue fires on every held-out query
    ratio = pred.mean / held.T
    assert np.all((ratio > 0.5) & (ratio < 2.0)), ratio  # each within 2x of its own length, long and short alike
    assert (pred.lo <= pred.mean).all() and (pred.mean <= pred.hi).all()
    assert ((pred.lo[code] < held.T[code]) & (held.T[code] < pred.hi[code])).mean() > 0.6  # the 80 % interval covers
    np.testing.assert_allclose(pred.mean, lm.predict(held.texts, held.prompt_tokens).mean)


def test_unknown_task_does_not_inherit_another_tasks_mean_length():
    m = _planted()
    lm, _ = fit_length_model(m)
    est = EnergyEstimate(
        j_per_prompt_token={"a": 0.01, "b": 0.02},
        j_per_output_token={"a": 0.1, "b": 0.2},
        output_tokens={"t0": {"a": 2.0, "b": 2.0}},
        output_tokens_any={"a": 2.0, "b": 2.0},
        output_tokens_prior={"a": 430.0, "b": 400.0},
        prior_source="chat-length prior",
    )
    novel = "Zzqx vortal plinth 97 ~~ ## qwv jjj kkk"  # unlike every training row, no cue
    T, notes = request_tokens(est, lm, ["a", "b"], [novel, novel], ["t0", "never-seen"], [20, 20])
    assert T[0].tolist() == [2.0, 2.0] and notes[0]["output_tokens_source"] == "task_mean"
    assert notes[1]["output_tokens_source"] == "prior" and notes[1]["prior"] == "chat-length prior"
    np.testing.assert_allclose(T[1], [430.0, 400.0], rtol=1e-6)  # the prior, not the seen task's 2 tokens
    T0, notes0 = request_tokens(est, None, ["a", "b"], [novel], ["never-seen"], [20])  # no length model: the prior
    np.testing.assert_allclose(T0[0], [430.0, 400.0])
    assert est.estimate(["a", "b"], [20], ["never-seen"])[0, 0] == 20 * 0.01 + 430.0 * 0.1


def test_max_tokens_bounds_the_estimate():
    est = EnergyEstimate(
        j_per_prompt_token={"a": 0.0},
        j_per_output_token={"a": 1.0},
        output_tokens={},
        output_tokens_any={"a": 5.0},
        output_tokens_prior={"a": 430.0},
    )
    T, notes = request_tokens(est, None, ["a"], ["hi", "hi"], [None, None], [3, 3], max_tokens=[64, None])
    assert T[:, 0].tolist() == [64.0, 430.0] and notes[0]["output_tokens"]["a"][2] == 64.0
    assert bounded_energy(np.array([430.0]), np.array([430.0]), np.array([1.0]), 64)[0] == 64.0
    assert request_max_tokens({"max_tokens": 50, "max_completion_tokens": 20}) == 20
    assert request_max_tokens({"max_tokens": "9"}) is None and request_max_tokens({"max_tokens": True}) is None
    assert request_max_tokens({"max_tokens": -1}) is None and request_max_tokens(None) is None


def test_a_table_without_output_tokens_gives_the_prior_alone(tmp_path):
    m = _planted()
    m.T[:] = np.nan
    lm, info = fit_length_model(m)
    assert lm.W is None and "prior only" in info["model"]
    lm.save(tmp_path / "length.npz")
    pred = LengthModel.load(tmp_path / "length.npz").predict(["write a function"], [5])
    assert pred.source(0) == "prior" and pred.mean[0, 0] > 100


def test_known_task_prices_a_candidate_without_its_rows_with_the_length_model():
    """A task known from a few production rows of candidate "a" only: "b" gets the length model, not the prior."""
    m = _planted()
    lm, _ = fit_length_model(m.subset(np.flatnonzero(m.tasks != "t2")))
    est = EnergyEstimate(
        j_per_prompt_token={"a": 0.01, "b": 0.02},
        j_per_output_token={"a": 0.1, "b": 0.2},
        output_tokens={"t2": {"a": 5.0}},
        output_tokens_any={"a": 100.0, "b": 100.0},
        output_tokens_prior={"a": 430.0, "b": 400.0},
        prior_source="chat-length prior",
    )
    held = m.subset(np.flatnonzero((m.tasks == "t2") & np.array(["letter" in t for t in m.texts])))
    T, notes = request_tokens(est, lm, ["a", "b"], held.texts, list(held.tasks), held.prompt_tokens)
    assert (T[:, 0] == 5.0).all()  # the task's own mean where the candidate has rows
    ratio = T[:, 1] / held.T[:, 1]
    assert np.all((ratio > 0.5) & (ratio < 2.0)), ratio  # ≈2 tokens from the length model, not 400 from the prior
    assert all(n["output_tokens_source"] == "task_mean" and n["length_model_for"] == ["b"] for n in notes)
    T0, notes0 = request_tokens(est, None, ["a", "b"], held.texts[:1], ["t2"], [20])  # no length model: the prior
    assert T0[0].tolist() == [5.0, 400.0] and notes0[0]["prior_for"] == ["b"]
    assert notes0[0]["output_tokens"]["b"] == [100.0, 400.0, 1000.0]  # the prior's band


def test_cue_flags_tried_at_their_anchors_equal_a_search_everywhere():
    """The serving shortcut (a cue's pattern tried only where one of its anchors occurs, on ASCII text) flags
    exactly what a search of the whole tail flags: every anchor, upper case, non-ASCII text, near misses."""
    from litellm_energy_router.router.length_cues import CUE_CHARS, CUES, LENGTH_RE, _fires, _may_ask_length

    texts = [
        "Write a Python function that adds two numbers.",
        "WRITE THE PROGRAM",
        "prefix: fix this",
        "def f(x):\n  return x",
        "ASSERT Foo(1)",
        "```js\nx\n```",
        "I like javascript",
        "c++ and SQL",
        "Explain step-by-step",
        "STEP BY STEP",
        "summarise the article",
        "in detail please",
        "Solve 3 + 4",
        "how MANY apples",
        "12 * 3",
        "no digits here",
        "Fill in the ____",
        "the Blank is",
        "blanket",
        "(B) second\nAnswer:",
        "Answer with the letter",
        "yes or no?",
        "Describe ÄÖÜ in 200 words",
        "ſtep by ſtep explain",
        "K\u212a 3 Lines",
        "write 5 bullet points",
        "a" * 5000 + " essay",
        "essay " + "b" * 5000,
        "",
        "Compare 10 items",
        "one sentence only",
        "story time: 2 paragraphs",
        "In ONE WORD: capital?",
        "someone word",
        "Single letter, please",
        "TRUE OR FALSE: x",
        "Give a short answer",
        "briefly",
        "only give answer",
        "Without any explanation",
        "phone: yes or no",
        "3+4",
        "3 +\n 4",
        "x = y and 12",
        "12 apples - none",
        "what?  ",
        "what? no",
        "\u0663+\u0664",
        "3\x1c=\x1c4",
    ]
    for t in texts:
        tail = t[-CUE_CHARS:]
        low = tail.lower() if tail.isascii() else None
        for name, alts in CUES:
            fast = any(_fires(p, tail, low, a) for p, a in alts)
            assert fast == any(p.search(tail) for p, _ in alts), (name, t[:40])
        if low is not None and not _may_ask_length(low):
            assert not list(LENGTH_RE.finditer(tail)), t[:40]
    assert all(
        a == a.lower() for _, alts in CUES for _, anchors in alts if isinstance(anchors, tuple) for a in anchors
    )  # found in the lower-cased tail


def test_support_stops_early_only_where_no_weight_can_change():
    """The reference scan stops at the first row whose cosine reaches the full-weight cosine; below it the figure
    is the full scan's largest cosine, at or above it a lower bound that is itself at or above it."""
    from litellm_energy_router.router.length_model import SKETCH, SUPPORT_FULL

    rng = np.random.default_rng(3)
    ref = rng.normal(size=(100, SKETCH))
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    lm = LengthModel([10.0, 20.0], ref=ref, support=(0.2, 0.3))
    full = lambda v: float(np.max(lm._ref.reshape(-1, SKETCH) @ v))  # noqa: E731 - padded rows repeat the last
    for j in (0, 40, 99):  # a row of the first chunk, of the second, of the rest
        near = ref[j] + rng.normal(scale=0.02, size=SKETCH)
        v = (near / np.linalg.norm(near)).astype(np.float32)
        assert full(v) >= SUPPORT_FULL and SUPPORT_FULL <= lm.support(v) <= full(v) + 1e-6
    for _ in range(20):  # far from every row: the whole scan
        v = rng.normal(size=SKETCH)
        v = (v / np.linalg.norm(v)).astype(np.float32)
        assert lm.support(v) == full(v) < SUPPORT_FULL


def test_cover_order_is_a_permutation_that_keeps_every_support_figure():
    """The reference rows in cover order: the same rows, each query's largest cosine unchanged, and a query near a
    covering row stops in the first chunk."""
    from litellm_energy_router.training.length_fit import cover_order

    from litellm_energy_router.router.length_model import SKETCH

    rng = np.random.default_rng(5)
    centres = rng.normal(size=(5, SKETCH))
    ref = np.concatenate([c + rng.normal(scale=0.3, size=(40, SKETCH)) for c in centres])
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    order = cover_order(ref, 0.7)
    assert sorted(order.tolist()) == list(range(len(ref)))
    q = rng.normal(size=(20, SKETCH))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    np.testing.assert_allclose((q @ ref[order].T).max(axis=1), (q @ ref.T).max(axis=1))
    covered = (ref[order[:5]] @ ref.T).max(axis=0) >= 0.7  # the first row of each group covers it
    assert covered.all()


def test_the_choice_cue_reads_option_lines_and_does_not_scan_blank_lines():
    """An option line ("A) ...", indented or after blank lines) flags the choice cue; whitespace alone does not.
    The pattern's leading blank is horizontal only: matched over newlines it backtracked quadratically on a run of
    blank lines (benchmarks/hostile_text.py: 150 ms for one 8 KiB request, on the event loop)."""
    from litellm_energy_router.router.length_cues import CUES, DENSE, dense_features

    choice = DENSE.index("choice")
    pattern = dict(CUES)["choice"][0][0]
    assert dense_features("Which is right?\n\n\n  B) the second\nC) the third", 10.0)[choice] == 1
    assert dense_features("Which is right?\n\tA: yes", 10.0)[choice] == 1
    assert dense_features("Q" + "\n" * 500 + "1", 10.0)[choice] == 0
    assert "\\s*\\(?[A-Ea-e]" not in pattern.pattern  # no \s* that crosses lines before the option letter
