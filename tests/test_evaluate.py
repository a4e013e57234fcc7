"""Evaluation harness: AIQ on hand-computed curves, hull/oracle/random properties, the λ grid, the routing-time
energy estimator, the table matrix, and the report files (splits by query: test_splits.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from litellm_energy_router.training.data import MatrixError, kfold, load_matrix
from litellm_energy_router.training.energy_fit import estimate_energy, fit_energy_estimate
from litellm_energy_router.training.evaluate import (
    Curve,
    aiq,
    evaluate,
    hull_value,
    joules_at_accuracy,
    oracle_choices,
    pareto_hull,
    phase_transition,
)
from litellm_energy_router.training.report import write_report

from litellm_energy_router.energy.profile import EnergyProfile, ModelEnergy
from litellm_energy_router.router.checkpoint import EnergyEstimate
from litellm_energy_router.router.decide import decide_lambda, lambda_breakpoints, lambda_grid
from litellm_energy_router.table import Candidate, Run, make_query, open_store

# -- AIQ and the hull, by hand -------------------------------------------------------------------------

# (10, .5), (20, .7), (40, .8), x_max 50: area = 0 on [0,10] + (.5+.7)/2*10 + (.7+.8)/2*20 + .8*10 = 6+15+8 = 29
HAND_X, HAND_Y, HAND_AREA = [10.0, 20.0, 40.0], [0.5, 0.7, 0.8], 29.0


def test_aiq_of_hand_built_concave_curve():
    assert aiq(HAND_X, HAND_Y, 50.0) == pytest.approx(HAND_AREA / 50)


def test_points_below_or_after_the_hull_do_not_change_aiq():
    # (15, .55) is under the chord (10,.5)-(20,.7); (30, .6) under the hull; (45, .75) costs more for less;
    # (60, .79) lies beyond x_max with less accuracy than the plateau
    x = HAND_X + [15.0, 30.0, 45.0, 60.0]
    y = HAND_Y + [0.55, 0.6, 0.75, 0.79]
    assert aiq(x, y, 50.0) == pytest.approx(HAND_AREA / 50)
    hx, hy = pareto_hull(x, y)
    assert hx.tolist() == HAND_X and hy.tolist() == HAND_Y


def test_non_concave_point_is_bridged():
    # (30, .72) is under the chord (20,.7)-(40,.8) (0.75 there), while (15, .68) lifts the hull:
    # vertices (10,.5), (15,.68), (40,.8): area = (.5+.68)/2*5 + (.68+.8)/2*25 + .8*10 = 2.95 + 18.5 + 8 = 29.45
    x, y = [10, 15, 20, 30, 40], [0.5, 0.68, 0.7, 0.72, 0.8]
    hx, hy = pareto_hull(x, y)
    assert hx.tolist() == [10, 15, 40]
    assert aiq(x, y, 50) == pytest.approx(29.45 / 50)


def test_aiq_edge_cases():
    assert aiq([10.0], [0.5], 50.0) == pytest.approx(0.5 * 40 / 50)  # one point: flat after it
    assert aiq([10.0, 20.0], [0.9, 0.5], 50.0) == pytest.approx(0.9 * 40 / 50)  # cheapest is best
    assert aiq([60.0], [0.9], 50.0) == 0.0  # nothing below x_max
    assert aiq([0.0, 50.0], [0.0, 1.0], 50.0) == pytest.approx(0.5)  # triangle
    # equal energy: the better point counts
    assert aiq([10.0, 10.0], [0.3, 0.6], 20.0) == pytest.approx(0.6 * 10 / 20)


def test_hull_value_and_joules_at_accuracy():
    hx, hy = pareto_hull(HAND_X, HAND_Y)
    assert hull_value(hx, hy, 5.0) == 0.0
    assert hull_value(hx, hy, 15.0) == pytest.approx(0.6)
    assert hull_value(hx, hy, 100.0) == pytest.approx(0.8)
    assert joules_at_accuracy(hx, hy, 0.75) == pytest.approx(30.0)
    assert joules_at_accuracy(hx, hy, 0.4) == pytest.approx(10.0)
    assert joules_at_accuracy(hx, hy, 0.8) == pytest.approx(40.0)
    assert joules_at_accuracy(hx, hy, 0.85) == float("inf")


# -- reference points on random data ---------------------------------------------------------------------


def _random_problem(n=400, K=4, seed=0):
    rng = np.random.default_rng(seed)
    skill = np.linspace(0.4, 0.8, K)
    Y = (rng.random((n, K)) < skill).astype(float)
    E = np.array([5.0, 10.0, 30.0, 60.0])[:K] * rng.uniform(0.7, 1.3, (n, K))
    return Y, E


def test_oracle_is_cheapest_correct_else_cheapest():
    Y = np.array([[0, 1, 1], [0, 0, 0], [1, 1, 0]], dtype=float)
    E = np.array([[1, 5, 3], [4, 2, 9], [7, 1, 1]], dtype=float)
    assert oracle_choices(Y, E).tolist() == [2, 1, 1]


def test_reference_points_properties():
    Y, E = _random_problem()
    ev = evaluate(Y, E, {}, ["a", "b", "c", "d"])
    zero, rnd, orc = ev.method("zero router (static hull)"), ev.method("random"), ev.method("oracle")
    # oracle: accuracy = share of queries some candidate answers, at no more J than any static point's best
    assert orc.curve.accuracy[0] == pytest.approx(Y.max(axis=1).mean())
    assert orc.curve.accuracy[0] >= ev.static_accuracy.max()
    oc = oracle_choices(Y, E)
    assert orc.curve.energy_j[0] == pytest.approx(E[np.arange(len(Y)), oc].mean())  # λ = 0: cheapest correct
    assert orc.curve.shares[-1].tolist() == (np.bincount(np.argmin(E, axis=1), minlength=4) / len(Y)).tolist()
    assert orc.aiq >= zero.aiq >= rnd.aiq
    # random (uniform over candidates) lies on or under the zero router's hull
    hx, hy = zero.curve.hull()
    assert hull_value(hx, hy, rnd.curve.energy_j[0]) >= rnd.curve.accuracy[0] - 1e-12
    # the zero router reaches the best single candidate at exactly its J
    assert zero.joules_at_best == pytest.approx(ev.best_energy)
    assert ev.best == int(np.argmax(ev.static_accuracy))


def test_perfect_router_reaches_the_oracle_and_static_router_does_not_beat_zero():
    Y, E = _random_problem(seed=1)
    K = Y.shape[1]
    static_P = np.tile(Y.mean(axis=0), (len(Y), 1))
    static_E = np.tile(E.mean(axis=0), (len(Y), 1))
    ev = evaluate(Y, E, {"perfect": (Y, E), "static": (static_P, static_E)}, list("abcd"))
    perfect, static, zero = ev.method("perfect"), ev.method("static"), ev.method("zero router (static hull)")
    # λ = 0 with P = Y and Ê = E picks the cheapest correct candidate: the oracle point
    orc = ev.method("oracle").curve
    assert perfect.curve.accuracy[0] == pytest.approx(orc.accuracy[0])
    assert perfect.curve.energy_j[0] == pytest.approx(orc.energy_j[0])
    assert perfect.aiq > zero.aiq
    assert ev.method("oracle").aiq >= perfect.aiq - 1e-3  # the oracle frontier (more points) bounds it
    # a router that knows nothing per query only reproduces static points
    assert static.aiq <= zero.aiq + 1e-12
    for m in (perfect, static):
        assert np.allclose(m.curve.shares.sum(axis=1), 1.0)
        assert m.curve.knob[0] == 0.0 and np.all(np.diff(m.curve.knob) >= 0)
        # the cheapest end: every row gets its cheapest candidate by Ê
        assert (
            m.curve.shares[-1].tolist()
            == (np.bincount(np.argmin(E if m is perfect else static_E, axis=1), minlength=K) / len(Y)).tolist()
        )
    assert perfect.target_curve is not None and perfect.aiq_target > zero.aiq


def test_per_fold_aiq_and_shape_errors():
    Y, E = _random_problem(seed=2)
    folds = kfold([str(i) for i in range(len(Y))], 4, seed=0)
    ev = evaluate(Y, E, {"perfect": (Y, E)}, list("abcd"), folds=[te for _, te in folds])
    assert len(ev.method("perfect").aiq_folds) == 4
    with pytest.raises(ValueError, match="must be"):
        evaluate(Y, E, {"bad": (Y[:, :2], E)}, list("abcd"))


def test_lambda_grid_spans_the_curve_and_breakpoints_are_switches():
    Y, E = _random_problem(seed=3)
    rng = np.random.default_rng(3)
    P = np.clip(Y * 0.6 + rng.random(Y.shape) * 0.4, 0, 1)
    grid = lambda_grid(P, E, 60.0, 15)
    assert len(grid) == 15 and grid[0] == 0.0 and np.all(np.diff(grid) >= 0)
    assert (decide_lambda(P, E, grid[0], 60.0) == decide_lambda(P, E, 0.0, 60.0)).all()
    assert (decide_lambda(P, E, grid[-1], 60.0) == np.argmin(E, axis=1)).all()
    for b in lambda_breakpoints(P, E, 60.0)[:40]:
        lo, hi = decide_lambda(P, E, b * (1 - 1e-4), 60.0), decide_lambda(P, E, b * (1 + 1e-4), 60.0)
        assert (lo != hi).any()
    # every step of the grid changes some decisions (the points spread over the whole curve)
    steps = [(decide_lambda(P, E, a, 60.0) != decide_lambda(P, E, b, 60.0)).sum() for a, b in zip(grid[:-1], grid[1:])]
    assert min(steps) > 0


def test_phase_transition_on_a_hand_made_curve():
    lams = np.array([0.0, 0.1, 1.0, 10.0])
    # candidates: small (1 J), mid (2 J), large (10 J); large share 1.0, 0.8, 0.2, 0.0
    shares = np.array([[0, 0, 1.0], [0.2, 0, 0.8], [0.8, 0, 0.2], [1.0, 0, 0]])
    c = Curve("r", "lambda", lams, np.zeros(4), np.zeros(4), shares)
    ph = phase_transition(c, np.array([1.0, 2.0, 10.0]), ["s", "m", "l"])
    assert ph.large == ["l"]
    # 0.5 is halfway between 0.8 (λ=0.1) and 0.2 (λ=1) in log λ: 10**-0.5
    assert ph.lam50 == pytest.approx(10**-0.5)
    assert ph.width_decades is not None and ph.width_decades > 0


# -- splits ------------------------------------------------------------------------------------------


# -- matrix and energy estimator from a real table ----------------------------------------------------


def _profile() -> EnergyProfile:
    return EnergyProfile(
        models={
            "small": ModelEnergy(j_per_output_token=0.1, j_per_prompt_token=0.01),
            "big": ModelEnergy(j_per_output_token=1.0, j_per_prompt_token=0.05),
        }
    )


def _fill(url: str) -> None:
    store = open_store(url)
    qs, runs = [], []
    rate = {"small": (0.01, 0.1), "big": (0.05, 1.0), "other": (0.02, 0.5)}  # "other" is not in the profile
    for i in range(40):
        task = "math" if i % 2 else "chat"
        qs.append(make_query(f"q{i}", task, f"prefix\n\nquestion {i}"))
        pt = 100 + i
        for c, (jp, jo) in rate.items():
            ct = (10 if task == "chat" else 50) + (i % 3)
            if c == "other" and i == 39:
                continue  # q39 misses a label for "other"
            runs.append(
                Run(
                    query_id=f"q{i}",
                    candidate=c,
                    source="import",
                    score=float((i + len(c)) % 2),
                    prompt_tokens=pt,
                    completion_tokens=ct,
                    energy_j=pt * jp + ct * jo,
                )
            )
    # a production query stored without its text (privacy): dropped unless require_text=False
    qs.append(make_query("secret", "chat", "hidden", store_text=False))
    runs += [
        Run(
            query_id="secret",
            candidate=c,
            source="production",
            score=1.0,
            prompt_tokens=5,
            completion_tokens=5,
            energy_j=1.0,
        )
        for c in rate
    ]
    # a newer production run overrides q0/small's imported score
    runs.append(
        Run(
            query_id="q0",
            candidate="small",
            source="production",
            score=1.0,
            prompt_tokens=100,
            completion_tokens=10,
            energy_j=2.0,
        )
    )
    store.write(qs, runs, candidates=[Candidate(name=c) for c in rate])
    store.close()


def test_load_matrix_and_energy_estimator(sqlite_url):
    _fill(sqlite_url)
    store = open_store(sqlite_url)
    m = load_matrix(store)
    assert m.candidates == ["small", "other", "big"]  # by mean J
    assert m.n == 39 and m.dropped == {"missing_label": 1, "no_text": 1}
    assert load_matrix(store, require_text=False).n == 40
    i0 = list(m.ids).index("q0")
    assert m.Y[i0, 0] == 1.0 and m.E[i0, 0] == 2.0  # the newest run wins
    assert m.prompt_tokens[i0] == 100
    assert m.subset([0, 1]).n == 2
    assert m.max_run_id == store.count_runs()  # the watermark covers every run read
    est = fit_energy_estimate(m, _profile())
    # J/token are fitted to the rows' (tokens, J), whatever the profile says ("other" is not in it)
    assert est.j_per_prompt_token["big"] == pytest.approx(0.05, rel=1e-6)
    assert est.j_per_output_token["big"] == pytest.approx(1.0, rel=1e-6)
    assert est.j_per_prompt_token["other"] == pytest.approx(0.02, rel=1e-6)
    assert est.j_per_output_token["other"] == pytest.approx(0.5, rel=1e-6)
    Eh = estimate_energy(est, m)
    chat = m.tasks == "chat"
    assert est.output_tokens["chat"]["big"] == pytest.approx(m.T[chat, 2].mean())
    assert Eh[chat, 2] == pytest.approx(m.prompt_tokens[chat] * 0.05 + m.T[chat, 2].mean() * 1.0)
    from litellm_energy_router.energy.profile import CHAT_OUTPUT_TOKENS

    unknown = est.estimate(m.candidates, [100], ["never-seen"])
    # an unknown task takes the conservative chat-length prior ("big" is not in the profile: the default), not
    # the other tasks' mean
    assert est.output_tokens_prior["big"] == CHAT_OUTPUT_TOKENS and est.prior_source
    assert unknown[0, 2] == pytest.approx(100 * 0.05 + CHAT_OUTPUT_TOKENS * 1.0)
    back = EnergyEstimate.model_validate_json(est.model_dump_json())  # what the checkpoint manifest holds
    assert np.allclose(estimate_energy(back, m), Eh)
    assert m.take([0, 1]).n == 2 and len(m) == 39
    with pytest.raises(MatrixError, match="'nope'"):
        load_matrix(store, ["small", "nope"])
    # rows that cannot determine J/token (no completion tokens) take the profile's; without it, an error
    blind = m.subset(np.arange(m.n))
    blind.T = np.full_like(m.T, np.nan)
    with pytest.raises(MatrixError, match="'other'"):
        fit_energy_estimate(blind, _profile())  # "other" is neither fittable nor in the profile
    full = _profile()
    full.models["other"] = ModelEnergy(j_per_output_token=0.7, j_per_prompt_token=0.03)
    est2 = fit_energy_estimate(blind, full)
    assert est2.j_per_prompt_token["small"] == 0.01 and est2.j_per_output_token["big"] == 1.0
    assert est2.j_per_output_token["other"] == 0.7
    store.close()


def test_empty_table_is_a_clear_error(sqlite_url):
    with pytest.raises(MatrixError, match="0 fully labelled queries"):
        load_matrix(open_store(sqlite_url))


# -- report files ----------------------------------------------------------------------------------


def test_report_files_written(tmp_path):
    Y, E = _random_problem(n=120, seed=4)
    rng = np.random.default_rng(4)
    P = np.clip(0.5 * Y + 0.5 * rng.random(Y.shape), 0, 1)
    ev = evaluate(Y, E, {"noisy": (P, E), "perfect": (Y, E)}, ["org/a", "b", "c", "d"], n_points=9)
    paths = write_report(ev, tmp_path / "out", title="T")
    for name in ("report.md", "pareto.png", "phase.png", "curves.csv"):
        assert paths[name].exists() and paths[name].stat().st_size > 0
    md = paths["report.md"].read_text()
    assert "| noisy |" in md and "| perfect |" in md and "oracle" in md and "AIQ" in md
    assert f"{ev.method('perfect').aiq:.4f}" in md
    lines = paths["curves.csv"].read_text().splitlines()
    assert lines[0].startswith("method,mode,knob,energy_j,accuracy,share:org/a")
    n_rows = sum(
        len(m.curve.knob) + (len(m.target_curve.knob) if m.target_curve is not None else 0) for m in ev.methods
    )
    assert len(lines) == 1 + n_rows
    assert paths["pareto.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## Calibration of the predicted P" in md and "| perfect | 0.0000 | 0.0000 |" in md


def test_calibration_reliability_bins():
    from litellm_energy_router.training.evaluate import calibration

    rng = np.random.default_rng(0)
    P = rng.random((4000, 3))
    Y = (rng.random(P.shape) < P).astype(float)  # outcomes drawn at the predicted rate: calibrated
    good = calibration(P, Y)
    assert len(good.bins) == 10 and sum(b[2] for b in good.bins) == P.size
    assert good.ece < 0.03 and all(abs(mp - obs) < 0.06 for _, _, _, mp, obs in good.bins)
    assert abs(good.brier - np.mean((P - Y) ** 2)) < 1e-12
    over = calibration(np.clip(P + 0.3, 0, 1), Y)  # over-confident by 0.3 where not clipped
    assert over.ece > 0.2 and over.brier > good.brier


def test_eval_command_writes_report_and_rejects_bad_input(sqlite_url, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    exe = str(Path(sys.executable).with_name("energy-router"))
    _fill(sqlite_url)  # candidates absent from the bundled profile: J/token fitted from the rows
    out = tmp_path / "report"
    r = subprocess.run(
        [exe, "eval", "--db", sqlite_url, "--out", str(out), "--baselines", "task_prior", "--folds", "3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "| task_prior |" in r.stdout and "oracle" in r.stdout
    assert all((out / f).stat().st_size > 0 for f in ("report.md", "pareto.png", "phase.png", "curves.csv"))
    r = subprocess.run(
        [exe, "eval", "--db", sqlite_url, "--out", str(out), "--baselines", "task_prior,nope"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "unknown baseline 'nope'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_read_decisions_aligns_route_output_with_the_table(sqlite_url, tmp_path):
    from litellm_energy_router.training.crossval import read_decisions

    _fill(sqlite_url)
    m = load_matrix(open_store(sqlite_url))
    rng = np.random.default_rng(0)
    P = rng.random((m.n, m.K))
    path = tmp_path / "decisions.jsonl"
    with open(path, "w") as fh:
        for lam in (0.0, 0.5):  # two operating points: the same scores repeat
            for i in reversed(range(m.n)):
                task, row = m.tasks[i], str(m.ids[i])[1:]
                fh.write(
                    json.dumps(
                        {
                            "row": int(row),
                            "eval_name": task,
                            "model": m.candidates[0],
                            "lambda": lam,
                            "scores": dict(zip(m.candidates, P[i])),
                            "energy_j": dict(zip(m.candidates, m.E[i])),
                        }
                    )
                    + "\n"
                )
    P2, E2 = read_decisions(path, m, id_format="q{row}")
    assert np.allclose(P2, P) and np.allclose(E2, m.E)
    gone = int(str(m.ids[0])[1:])
    kept = [ln for ln in path.read_text().splitlines() if json.loads(ln)["row"] != gone]
    path.write_text("\n".join(kept))  # one table query has no decision at any operating point
    with pytest.raises(ValueError, match="1 of 39 table queries have no decision line"):
        read_decisions(path, m, id_format="q{row}")


def test_paired_fold_delta():
    Y, E = _random_problem(seed=5)
    folds = [te for _, te in kfold([str(i) for i in range(len(Y))], 4, seed=0)]
    ev = evaluate(Y, E, {"perfect": (Y, E), "same": (Y, E)}, list("abcd"), folds=folds)
    assert ev.paired_fold_delta("perfect", "same") == (0.0, 0.0)
    m = ev.method("perfect")
    assert len(m.aiq_folds) == 4 and all(a > 0 for a in m.aiq_folds)


def test_rows_that_record_no_energy_are_one_line_not_a_division_by_zero():
    """Every held-out row at 0 J (a meter that wrote zeros): AIQ has no energy axis; one line naming it."""
    from litellm_energy_router.training.data import MatrixError
    from litellm_energy_router.training.evaluate import evaluate

    Y = np.array([[0.0, 1.0], [1.0, 1.0]])
    with pytest.raises(MatrixError, match="record 0 J for every candidate"):
        evaluate(Y, np.zeros_like(Y), {"r": (Y, np.zeros_like(Y))}, ["small", "large"])


def test_a_tournament_label_wins_over_a_later_production_label_of_the_same_pair(sqlite_url):
    """A shadow or tournament run and a production run label one (query, candidate) pair: the matrix keeps the
    unbiased run whatever was written last, as the pairs reader does, so training rows, pairs and the promotion
    gate's held-out truth agree."""
    import time

    from router_fixtures import planted_rows

    from litellm_energy_router.table import open_store

    store = open_store(sqlite_url)
    cands, queries, runs = planted_rows(6, prefix="a")
    store.write(queries, runs, candidates=cands)
    first = next(store.iter_runs())
    time.sleep(0.01)
    keep = ("query_id", "candidate", "energy_j", "prompt_tokens", "completion_tokens")
    store.write(runs=[{**{k: first[k] for k in keep}, "source": "production", "score": 1.0 - first["score"]}])
    m = load_matrix(store)
    qi, ci = list(m.ids).index(first["query_id"]), m.candidates.index(first["candidate"])
    assert m.Y[qi, ci] == first["score"]
    store.close()


def test_a_table_stored_without_text_says_so(sqlite_url):
    """Every query fully labelled but stored without its text (privacy mode): the error names that, not "no
    query has labelled runs for all candidates"."""
    from router_fixtures import planted_rows

    from litellm_energy_router.table import open_store

    store = open_store(sqlite_url)
    cands, queries, runs = planted_rows(5, prefix="p")
    store.write([q.model_copy(update={"text": None}) for q in queries], runs, candidates=cands)
    with pytest.raises(MatrixError, match=r"5 fully labelled queries are stored without their text"):
        load_matrix(store)
    assert len(load_matrix(store, require_text=False)) == 5
    store.close()


def test_joules_at_accuracy_when_the_hull_ends_a_rounding_below_the_target():
    """The target (a column's mean) and a router's accuracy (a row-wise mean of the same scores) differ in their last
    bit with fractional labels: the hull's last point a rounding below the target raised IndexError (the gate,
    cross-validation and selection crashed). It reaches the target there."""
    from litellm_energy_router.training.evaluate import joules_at_accuracy

    target = 0.5291044776119403
    hx, hy = np.array([10.0, 90.0]), np.array([0.3, np.nextafter(target, 0.0)])
    assert joules_at_accuracy(hx, hy, target) == 90.0
    assert joules_at_accuracy(np.array([90.0]), np.array([np.nextafter(target, 0.0)]), target) == 90.0
    assert joules_at_accuracy(hx, np.array([0.3, 0.5]), target) == float("inf")
