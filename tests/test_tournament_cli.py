"""`energy-router tournament` as a real subprocess: errors, and kill (SIGINT, SIGKILL) + resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from proxy_process import default_sigint

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.demo.task_answers import TaskAnswers
from litellm_energy_router.table import open_store

EXE = str(Path(sys.executable).with_name("energy-router"))
TASKS = Path(__file__).parent / "data" / "tasks"
ACC = {
    "small": {"mmlu": 0.5, "gsm8k": 0.3, "mbpp": 0.5, "open": 0.5},
    "large": {"mmlu": 0.9, "gsm8k": 0.8, "mbpp": 0.9, "open": 0.9},
}
KEYS = {"small": "mistralai/mistral-7b-chat", "large": "meta/llama-2-70b-chat"}


def write_config(path: Path, backend: LocalBackend, **over) -> Path:
    cfg = {
        "candidates": [backend.deployment(c, energy_profile_key=KEYS[c]) for c in ACC],
        "tasks": [{"name": t, "source": str(TASKS / f"{t}.jsonl")} for t in ("mmlu", "gsm8k", "mbpp")],
        "concurrency": 1,
        "generation": {"num_retries": 0},
        **over,
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def start(cfg: Path, url: str) -> subprocess.Popen:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.Popen(
        [EXE, "tournament", "--config", str(cfg), "--db", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=default_sigint,
    )


def rows(url: str) -> list[dict]:
    with open_store(url) as s:
        return list(s.iter_runs())


def wait_rows(url: str, n: int, proc: subprocess.Popen, timeout: float = 120) -> int:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        have = len(rows(url))
        if have >= n:
            return have
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError(f"fewer than {n} rows after {timeout} s")


def assert_complete_rows(rs: list[dict]) -> None:
    """No partial rows: every written pair carries its grade, timings, tokens and energy."""
    for r in rs:
        assert r["status"] == "success" and r["score"] in (0.0, 1.0), r
        for k in ("latency_s", "ttft_s", "prompt_tokens", "completion_tokens", "energy_j", "energy_method"):
            assert r[k] is not None, (k, r)


@pytest.fixture
def slow_backend():
    b = LocalBackend(TaskAnswers(ACC, TASKS), delay_s=0.2, per_token_s=0.005)
    b.start()
    yield b
    b.stop()


def test_help_lists_tournament_commands():
    r = subprocess.run([EXE, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "tournament" in r.stdout and "shadow-tournament" in r.stdout


def test_bad_configs_exit_2_with_one_line(tmp_path, slow_backend):
    url = f"sqlite:///{tmp_path / 't.db'}"
    cases = {
        "meter": (dict(energy={"meter": "no-such-meter"}), "energy meter 'no-such-meter' is not registered"),
        "task": (dict(tasks=["squad"]), "task 'squad' is not registered"),
        "field": (dict(concurrency=0), "config key 'concurrency' = 0"),
    }
    for name, (over, msg) in cases.items():
        cfg = write_config(tmp_path / f"{name}.yaml", slow_backend, **over)
        r = subprocess.run(
            [EXE, "tournament", "--config", str(cfg), "--db", url], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2, (name, r.stderr)
        err = r.stderr.strip()
        assert len(err.splitlines()) == 1 and msg in err, (name, err)
    assert rows(url) == []


@pytest.mark.slow
def test_sigint_then_sigkill_then_resume_finishes_only_the_rest(tmp_path, slow_backend):
    url = f"sqlite:///{tmp_path / 'kill.db'}"
    cfg = write_config(tmp_path / "t.yaml", slow_backend)
    total = 2 * 3 * 8
    asked = lambda since: {(m, q) for m, q, _ in slow_backend.answers.log[since:]}  # noqa: E731

    # 1) Ctrl-C part-way: exit 130, finished pairs kept, nothing partial
    p = start(cfg, url)
    wait_rows(url, 6, p)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "interrupted" in err and "run the same command again to resume" in err
    after_int = rows(url)
    assert 6 <= len(after_int) < total
    assert_complete_rows(after_int)

    # 2) SIGKILL part-way through the resumed run: committed pairs survive, nothing partial
    mark = len(slow_backend.answers.log)
    p = start(cfg, url)
    wait_rows(url, len(after_int) + 6, p)
    p.kill()
    p.communicate(timeout=60)
    after_kill = rows(url)
    assert len(after_int) + 6 <= len(after_kill) < total
    assert_complete_rows(after_kill)
    done_before = {(r["candidate"], r["query_id"]) for r in after_int}
    assert not (asked(mark) & done_before)  # the second run never redid a pair the first had written

    # 3) resume: exactly the remaining pairs are asked, and the table is complete
    mark = len(slow_backend.answers.log)
    r = subprocess.run(
        [EXE, "tournament", "--config", str(cfg), "--db", url], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    final = rows(url)
    assert len(final) == total
    assert_complete_rows(final)
    have = {(x["candidate"], x["query_id"]) for x in after_kill}
    all_pairs = {(x["candidate"], x["query_id"]) for x in final}
    assert asked(mark) == all_pairs - have
    assert f"{total - len(have)} pairs run (0 failed), {len(have)} already in the table" in r.stdout


@pytest.mark.slow
def test_shadow_tournament_command(tmp_path, slow_backend):
    import json

    url = f"sqlite:///{tmp_path / 'shadow.db'}"
    judge = {
        "model_name": "judge",
        "litellm_params": {"model": "openai/judge-model", "api_base": slow_backend.base_url, "api_key": "x"},
    }
    cfg = write_config(tmp_path / "s.yaml", slow_backend, judge=judge, concurrency=4)
    queue = tmp_path / "queue.jsonl"
    queue.write_text(
        "".join(
            json.dumps(
                {
                    "query_id": f"prod-{i}",
                    "task": "chat",
                    "text": f"Question {i}?",
                    "call_id": f"c{i}",
                    "created": 1.7e9,
                }
            )
            + "\n"
            for i in range(3)
        )
    )
    args = [EXE, "shadow-tournament", "--config", str(cfg), "--db", url, "--queue", str(queue)]
    # no production rows here: the tournament writes the queries itself, hashed with the proxies' salt
    env = {**os.environ, "ENERGY_ROUTER_PRIVACY__SALT": "pepper"}
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "3 queued queries" in r.stdout and "6 pairs run (0 failed)" in r.stdout
    rs = rows(url)
    assert (
        len(rs) == 6 and {x["source"] for x in rs} == {"shadow"} and {x["query_source"] for x in rs} == {"production"}
    )
    assert {x["query_id"] for x in rs} == {"prod-0", "prod-1", "prod-2"} and all(x["score"] in (0.0, 1.0) for x in rs)
    # the entries it ran are taken out of the queue (their prompts stayed on disk for ever, the file grew)
    assert "3 entries run and taken out" in r.stdout and not queue.exists()
    queue.write_text(json.dumps({"query_id": "prod-9", "task": "chat", "text": "Q?", "created": 1.7e9}) + "\n")
    no_judge = write_config(tmp_path / "nj.yaml", slow_backend)
    r = subprocess.run(
        [EXE, "shadow-tournament", "--config", str(no_judge), "--db", url, "--queue", str(queue)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "needs a judge deployment" in r.stderr and len(r.stderr.strip().splitlines()) == 1
