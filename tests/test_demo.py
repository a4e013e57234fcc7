"""`energy-router demo`: the replay backend through a real ``litellm.completion``, and the whole quick demo
as a subprocess, checked against the table it leaves behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import litellm
import numpy as np
import pytest
from litellm_energy_router.profiling.routerbench import Record

from litellm_energy_router.demo.backend import FALLBACK_ANSWER, LocalBackend, ReplayAnswers
from litellm_energy_router.table import Candidate, Query, Run, open_store, text_hash
from litellm_energy_router.tokens import count_prompt_tokens

EXE = str(Path(sys.executable).with_name("energy-router"))
SMALL, BIG = "mistralai/mistral-7b-chat", "meta/llama-2-70b-chat"


def run(*args, cwd=None, timeout=1100):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "TOKENIZERS_PARALLELISM": "false",
    }
    return subprocess.run([EXE, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


@pytest.mark.litellm_integration
def test_replay_backend_through_litellm():
    prompt = "Question: which planet is largest?\nAnswer:"
    rec = Record("q:1", "arc", prompt, {SMALL: (1.0, " Jupiter, by far."), BIG: (0.0, " Saturn")}, "x:1")
    with LocalBackend(ReplayAnswers([rec])) as be:
        msgs = [{"role": "system", "content": "answer briefly"}, {"role": "user", "content": prompt}]
        r = litellm.completion(model=f"openai/{SMALL}", api_base=be.base_url, api_key="k", messages=msgs)
        assert r.choices[0].message.content == " Jupiter, by far."
        assert r.usage.prompt_tokens == count_prompt_tokens(prompt)
        assert r.usage.completion_tokens == count_prompt_tokens(" Jupiter, by far.")
        r = litellm.completion(model=f"openai/{BIG}", api_base=be.base_url, api_key="k", messages=msgs)
        assert r.choices[0].message.content == " Saturn"
        r = litellm.completion(
            model=f"openai/{SMALL}",
            api_base=be.base_url,
            api_key="k",
            messages=[{"role": "user", "content": "not recorded"}],
        )
        assert r.choices[0].message.content == FALLBACK_ANSWER
        assert r.usage.completion_tokens == count_prompt_tokens(FALLBACK_ANSWER)
        assert (be.requests, be.answers.unknown) == (3, 1)
        grade = be.answers.grade
        assert grade(prompt, SMALL) == 1.0 and grade(prompt, BIG) == 0.0
        assert grade(prompt, "other/model") is None and grade("not recorded", SMALL) is None
    with pytest.raises(RuntimeError, match="not started"):
        LocalBackend(ReplayAnswers([rec])).base_url


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo")
    url = f"sqlite:///{d / 'demo.db'}"
    r = run("demo", "--quick", "--db", url, "--workdir", str(d / "work"), cwd=d)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((d / "work" / "summary.json").read_text())
    store = open_store(url)
    rows = list(store.iter_runs())
    store.close()
    return r.stdout, summary, rows, d


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the quick demo is ~1-2 min on 2 idle cores, far more on busy ones
def test_quick_demo_logs_every_served_query(quick_demo):
    stdout, s, rows, _ = quick_demo
    prod = [r for r in rows if r["source"] == "production"]
    assert s["served_queries"] == len(prod) == 100
    assert len({r["call_id"] for r in prod}) == 100 and all(r["query_id"] == f"prod-{r['call_id']}" for r in prod)
    assert all(r["status"] == "success" and r["propensity"] is not None and 0 < r["propensity"] <= 1 for r in prod)
    assert all(r["score"] in (0.0, 1.0) for r in prod)
    assert all(r["energy_method"] == "estimate" and r["energy_j"] > 0 for r in prod)
    # the served queries were held back: none of their texts was imported before serving
    imported = {r["text"] for r in rows if r["source"] == "import"}
    assert imported and not imported & {r["text"] for r in prod}
    # replayed shadow rows: every candidate for every served query
    shadow = [r for r in rows if r["source"] == "shadow"]
    assert len(shadow) == s["shadow_rows"] == 100 * 6
    assert {r["query_id"] for r in shadow} == {r["query_id"] for r in prod}
    # each carries its production row's context (the context prior learns the app's traffic from them)
    ctx = {r["query_id"]: r["context"] for r in prod}
    assert all(r["context"] == ctx[r["query_id"]] for r in shadow) and all(ctx.values())


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the quick demo is ~1-2 min on 2 idle cores, far more on busy ones
def test_quick_demo_numbers_match_the_table(quick_demo):
    stdout, s, rows, _ = quick_demo
    prod = [r for r in rows if r["source"] == "production"]
    acc, joules = np.mean([r["score"] for r in prod]), np.mean([r["energy_j"] for r in prod])
    assert s["served"]["accuracy"] == pytest.approx(acc) and s["served"]["energy_j"] == pytest.approx(joules)
    # the served row as printed
    line = next(ln for ln in stdout.splitlines() if ln.startswith("energy router, served"))
    m = re.search(r"\)\s+([\d.]+)\s+[+-][\d.]+\s+([\d.]+) J est\.", line)
    assert (
        m and float(m.group(1)) == pytest.approx(acc, abs=5e-4) and float(m.group(2)) == pytest.approx(joules, abs=5e-3)
    )
    # the production row of the served candidate agrees with that candidate's shadow row (same answer)
    shadow = {(r["query_id"], r["candidate"]): r for r in rows if r["source"] == "shadow"}
    for r in prod:
        sh = shadow[(r["query_id"], r["candidate"])]
        assert (sh["score"], sh["prompt_tokens"], sh["completion_tokens"]) == (
            r["score"],
            r["prompt_tokens"],
            r["completion_tokens"],
        )
        assert sh["energy_j"] == pytest.approx(r["energy_j"])
    # baselines recomputed from the shadow rows (every candidate on every served query)
    by_cand: dict[str, list] = {}
    for (_, c), r in shadow.items():
        by_cand.setdefault(c, []).append(r)
    mean_j = {c: np.mean([r["energy_j"] for r in v]) for c, v in by_cand.items()}
    mean_acc = {c: np.mean([r["score"] for r in v]) for c, v in by_cand.items()}
    big, small = max(mean_j, key=mean_j.get), min(mean_j, key=mean_j.get)
    b = s["baselines"]
    assert b["always_largest"]["candidate"] == big and b["always_smallest"]["candidate"] == small
    assert b["always_largest"]["energy_j"] == pytest.approx(mean_j[big])
    assert b["always_largest"]["accuracy"] == pytest.approx(mean_acc[big])
    assert b["always_smallest"]["energy_j"] == pytest.approx(mean_j[small])
    assert b["random"]["accuracy"] == pytest.approx(np.mean(list(mean_acc.values())))
    assert b["random"]["energy_j"] == pytest.approx(np.mean(list(mean_j.values())))
    for key in ("always_largest", "always_smallest", "random"):
        assert f"{b[key]['accuracy']:.3f}" in next(ln for ln in stdout.splitlines() if ln.startswith(b[key]["name"]))


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the quick demo is ~1-2 min on 2 idle cores, far more on busy ones
def test_quick_demo_says_what_is_estimated_and_writes_the_plot(quick_demo):
    stdout, s, _, d = quick_demo
    assert "ESTIMATED joules" in stdout and "nothing here is measured on a GPU" in stdout
    for line in stdout.splitlines():  # every joule figure in the comparison says it is an estimate
        if re.search(r"\d J\b", line):
            assert "est" in line, line
    png = Path(s["pareto_png"])
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"pareto plot: {png}" in stdout
    assert s["first_version"]["status"] == "promoted"
    assert s["retrain"]["status"] in ("promoted", "rejected", "nothing_new")
    ptr = json.loads((d / "work" / "router.json").read_text())
    assert Path(ptr["checkpoint"]).exists()
    assert len(s["router_curve"]["lambda"]) == len(s["router_curve"]["accuracy"]) > 2


def test_demo_refuses_a_foreign_table_and_bad_options(tmp_path):
    url = f"sqlite:///{tmp_path / 'mine.db'}"
    store = open_store(url)
    store.write(
        [Query(id="q", task="t", text="x", text_hash=text_hash("x"))],
        [Run(query_id="q", candidate=SMALL, source="tournament")],
        candidates=[Candidate(name=SMALL)],
    )
    store.close()
    r = run("demo", "--quick", "--db", url, "--workdir", str(tmp_path / "w"), cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert url in r.stderr and "1 runs" in r.stderr
    r = run("demo", "--quick", "--lambda", "-1", "--db", f"sqlite:///{tmp_path / 'x.db'}", cwd=tmp_path)
    assert r.returncode == 2 and "--lambda" in r.stderr and "-1" in r.stderr


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_sft_progress_callback_prints_at_least_every_n_seconds_of_steps():
    """The TRL callback prints by wall time, not by step count: with steps of 0.7 s (fake clock), no two of its
    lines are more than every_s + one step apart, and the first step prints at once."""
    from types import SimpleNamespace

    from litellm_energy_router.training.progress import Heartbeat, trainer_progress_callback

    clock, lines, stamps = FakeClock(), [], []
    hb = Heartbeat(lambda s: (lines.append(s), stamps.append(clock.t)), every_s=3.0, idle_s=5.0, clock=clock)
    cb = trainer_progress_callback("SFT", hb)
    state = SimpleNamespace(global_step=0, max_steps=100)
    cb.on_train_begin(None, state, None)
    for step in range(1, 101):
        clock.t += 0.7
        state.global_step = step
        if step % 10 == 0:
            cb.on_log(None, state, None, logs={"loss": 1.0 / step})
        cb.on_step_end(None, state, None)
    assert lines[0].strip().startswith("SFT step 1/100") and stamps[0] == pytest.approx(0.7)
    gaps = np.diff([0.0, *stamps, clock.t])
    assert gaps.max() <= 3.0 + 0.7 + 1e-9 and len(lines) >= 70 / 3.7
    assert re.search(r"step 9\d/100 \(9\d%\), loss 0\.011, 6\d s, ETA \d s", lines[-1]), lines[-1]
    assert not hb.due(hb.idle_s)  # the ticker has nothing to add while steps report


def test_heartbeat_ticker_names_the_stage_after_a_silence():
    from litellm_energy_router.training.progress import Heartbeat

    clock, lines = FakeClock(), []
    hb = Heartbeat(lines.append, every_s=3.0, idle_s=5.0, clock=clock)
    hb.set_stage("[2/6] training")
    clock.t = 4.9
    assert not hb.check() and not lines
    clock.t = 5.0
    assert hb.check() and "[2/6] training: still working (5 s" in lines[-1]
    clock.t = 7.0
    assert not hb.check()  # counted from the last line printed
    hb.out("probe head: ...")
    clock.t = 11.9
    assert not hb.check() and len(lines) == 2


def test_longest_gap_counts_start_lines_and_exit():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from longest_gap import gaps, main

    assert gaps([2.0, 3.0, 9.5], 10.0) == [(2.0, -1), (1.0, 0), (6.5, 1), (0.5, 2)]
    assert main(["--quiet", "--", sys.executable, "-c", "print('a'); print('b')"]) == 0


def test_demo_docs_quote_the_code_defaults():
    """docs/demo.md and `demo --help` quote the defaults the code runs with (λ, ε, concurrency, SFT epochs, e_ref)."""
    from litellm_energy_router.demo.loop import (
        DEFAULT_CONCURRENCY,
        DEFAULT_EPSILON,
        DEFAULT_LAMBDA,
        DEMO_SFT_EPOCHS,
        DemoConfig,
    )
    from litellm_energy_router.router.decide import DEFAULT_E_REF_J

    doc = (Path(__file__).resolve().parents[1] / "docs" / "demo.md").read_text()
    assert f"λ = {DEFAULT_LAMBDA:g}, ε = {DEFAULT_EPSILON:g}" in doc
    assert f"{DEFAULT_CONCURRENCY} requests in flight" in doc
    assert f"SFT for {DEMO_SFT_EPOCHS:g} epoch" in doc
    quoted = {float(x) for x in re.findall(r"e_ref ([\d.]+) J", doc)}
    assert quoted == {DEFAULT_E_REF_J}, quoted
    quoted_lam = {float(x) for x in re.findall(r"strategy λ=([\d.]+)", doc)} | {
        float(x) for x in re.findall(r"served \(λ=([\d.]+)", doc)
    }
    assert quoted_lam == {DEFAULT_LAMBDA}, quoted_lam
    d = DemoConfig()
    assert f"`--db {d.db}`" in doc and f"`--workdir ./{d.workdir}`" in doc
    r = run("demo", "--help")
    assert (
        r.returncode == 0
        and f"default {DEFAULT_LAMBDA:g}" in r.stdout
        and f"[default: {DEFAULT_EPSILON:g}]" in r.stdout
    )
