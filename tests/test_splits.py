"""Splits by query for evaluation: k folds and the holdout keep each query (and each group of near-duplicate
queries, WinoGrande's twins) on one side, are deterministic, and stay stable as the table grows."""

from __future__ import annotations

import numpy as np
import pytest
from litellm_energy_router.training.data import holdout_split, kfold, near_duplicate_groups


def test_kfold_disjoint_by_query_covering_all_and_deterministic():
    ids = [f"q{i % 90}" for i in range(120)]  # 30 queries appear twice
    tasks = ["a" if i % 90 < 60 else "b" for i in range(120)]
    folds = kfold(ids, 5, seed=7, groups=tasks)
    seen = []
    for tr, te in folds:
        assert set(tr).isdisjoint(te) and len(tr) + len(te) == 120
        assert {ids[i] for i in tr}.isdisjoint({ids[i] for i in te})  # never split a query
        seen.extend(te.tolist())
        n_b = len({ids[i] for i in te if tasks[i] == "b"})
        assert n_b == 6  # 30 task-b queries spread evenly over 5 folds
    assert sorted(seen) == list(range(120))
    again = kfold(ids, 5, seed=7, groups=tasks)
    assert all((a[1] == b[1]).all() for a, b in zip(folds, again))
    assert any(set(a[1]) != set(b[1]) for a, b in zip(folds, kfold(ids, 5, seed=8, groups=tasks)))
    with pytest.raises(ValueError, match="folds"):
        kfold(["x", "y"], 3)


def test_holdout_is_stable_as_the_table_grows():
    ids = [f"q{i}" for i in range(1000)]
    tr, te = holdout_split(ids, 0.2)
    assert 150 < len(te) < 250 and set(tr).isdisjoint(te)
    ids2 = ids + [f"new{i}" for i in range(500)]
    _, te2 = holdout_split(ids2, 0.2)
    assert {ids[i] for i in te} == {ids2[i] for i in te2 if i < 1000}  # old queries keep their side


FEW_SHOT = "Q: an example?\nA) x\nB) y\nAnswer:\nB\n\n"


def _twins():
    """WinoGrande-style twins (one word changed), unrelated queries, and a twin text under another task."""
    texts = [
        FEW_SHOT
        + "The trophy did not fit in the suitcase because the _ was too large.\nA) trophy\nB) suitcase\nAnswer:",
        FEW_SHOT
        + "The trophy did not fit in the suitcase because the _ was too small.\nA) trophy\nB) suitcase\nAnswer:",
        FEW_SHOT + "Write a function to reverse the words of a sentence.",
        FEW_SHOT + "Which gas do plants take in from the air?\nA) oxygen\nB) carbon dioxide\nAnswer:",
        "The trophy did not fit in the suitcase because the _ was too large.\nA) trophy\nB) suitcase\nAnswer:",
        None,
        None,
    ]
    ids = ["w2", "w1", "m1", "a1", "z1", "p1", "p2"]
    tasks = ["wino", "wino", "mbpp", "arc", "other", "wino", "wino"]
    return texts, ids, tasks


def test_near_duplicates_share_a_group_key_within_a_task_only():
    texts, ids, tasks = _twins()
    g = near_duplicate_groups(texts, ids, tasks)
    assert g[0] == g[1] == "w1"  # the twins: key is the group's smallest id
    assert list(g[2:]) == ["m1", "a1", "z1", "p1", "p2"]  # unrelated, other task, and text-less rows stand alone
    assert near_duplicate_groups(texts, ids, tasks, threshold=1.0)[0] == "w2"  # a changed word: not identical
    same = [f"What is the capital of France? Answer in one word please {i}" for i in range(30)]
    g = near_duplicate_groups(same, [f"s{i}" for i in range(30)], ["t"] * 30)
    assert len(set(g)) == 30  # a component larger than max_size (templated traffic) is not grouped
    assert len(set(near_duplicate_groups(same, [f"s{i}" for i in range(30)], ["t"] * 30, max_size=30))) == 1


def test_near_duplicate_groups_are_connected_components():
    # a ~ b and b ~ c (Jaccard 9/11) but a !~ c (8/12): one chain, one group; d stands alone
    a = "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9"
    b = a.replace("w9", "x1")
    c = b.replace("w8", "x2")
    g = near_duplicate_groups([a, b, c, "something else entirely"], ["q3", "q7", "q1", "q0"])
    assert list(g) == ["q1", "q1", "q1", "q0"]
    assert list(near_duplicate_groups([], [])) == []


def test_splits_keep_near_duplicates_on_one_side():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(400)]
    texts, ids, tasks = [], [], []
    for p in range(60):  # 60 twin pairs, answer word changed
        base = " ".join(rng.choice(words, 12, replace=False))
        for j, last in enumerate(("large", "small")):
            texts.append(f"{base} because it was too {last}")
            ids.append(f"q{p}-{j}")
            tasks.append("wino")
    g = near_duplicate_groups(texts, ids, tasks)
    assert len(set(g)) == 60
    for tr, te in kfold(g, 5, seed=0, groups=tasks):
        assert {g[i] for i in tr}.isdisjoint({g[i] for i in te})
    tr, te = holdout_split(ids, 0.3, groups=g)
    assert {g[i] for i in tr}.isdisjoint({g[i] for i in te}) and len(te) > 0
    assert 0.15 < len(te) / len(ids) < 0.45  # the share is of groups: twins do not inflate it
    assert {g[i] for i in te} == {g[i] for i in holdout_split(list(g), 0.3)[1]}  # the group key's side


def test_identical_queries_share_a_key_however_many_there_are():
    """A component over ``max_size`` rows keeps its rows' own ids (templated traffic), but 25 copies of one popular
    prompt (each production request its own query id) were split that way too: 22 trained on, 3 held out. Identical
    queries always share a key; the other rows of a big component still keep theirs."""
    texts = ["What is the capital of France?"] * 25 + [f"Summarise ticket {i} for the support team" for i in range(30)]
    ids = [f"prod-{i:03d}" for i in range(55)]
    keys = near_duplicate_groups(texts, ids, ["chat"] * 55)
    assert set(keys[:25].tolist()) == {"prod-000"}
    assert len(set(keys[25:].tolist())) == 30  # 30 near-duplicate templates, a component over 20: their own ids
    tr, te = holdout_split(ids, 0.3, groups=keys)
    assert not ({*tr.tolist()} & set(range(25)) and {*te.tolist()} & set(range(25)))
