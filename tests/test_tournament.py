"""The tournament runner end to end: real LiteLLM Router, a real OpenAI-compatible HTTP server on
127.0.0.1 whose answers are right with known probabilities, real graders, real table."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest
from litellm_energy_router.profiling.config import parse_tournament_config
from litellm_energy_router.profiling.runner import Tournament, build_jobs
from litellm_energy_router.profiling.shadow_tournament import DEFER_S, ShadowEntry, read_queue, shadow_jobs
from litellm_energy_router.profiling.vllm_offline import OfflineDriver

from litellm_energy_router.demo.backend import LocalBackend
from litellm_energy_router.demo.task_answers import TaskAnswers
from litellm_energy_router.energy.meter import EnergyReading
from litellm_energy_router.energy.profile import load_profile
from litellm_energy_router.plugins import get_plugin_manager, hookimpl
from litellm_energy_router.settings import ConfigError, PrivacySettings
from litellm_energy_router.table import Candidate, Run, make_query, open_store, text_hash

TASKS = Path(__file__).parent / "data" / "tasks"
SEVEN = ["mmlu", "arc_challenge", "hellaswag", "winogrande", "gsm8k", "mbpp", "mt_bench"]
ACC = {
    "small": {
        "mmlu": 0.4,
        "arc_challenge": 0.5,
        "hellaswag": 0.5,
        "winogrande": 0.5,
        "gsm8k": 0.2,
        "mbpp": 0.25,
        "mt_bench": 0.3,
        "open": 0.3,
    },
    "medium": {
        "mmlu": 0.6,
        "arc_challenge": 0.7,
        "hellaswag": 0.7,
        "winogrande": 0.6,
        "gsm8k": 0.5,
        "mbpp": 0.5,
        "mt_bench": 0.6,
        "open": 0.6,
    },
    "large": {
        "mmlu": 0.85,
        "arc_challenge": 0.9,
        "hellaswag": 0.9,
        "winogrande": 0.8,
        "gsm8k": 0.85,
        "mbpp": 0.8,
        "mt_bench": 0.9,
        "open": 0.9,
    },
}
PROFILE_KEY = {
    "small": "mistralai/mistral-7b-chat",
    "medium": "mistralai/mixtral-8x7b-chat",
    "large": "meta/llama-2-70b-chat",
}


class ConstantPowerStandIn:
    """STAND-IN for a GPU energy meter (there is no GPU here): a GPU drawing a constant ``power_w``
    watts, so cumulative joules = power_w x seconds since creation."""

    name = "standin-constant-power"
    method = "power_sampling"

    def __init__(self, power_w: float = 100.0) -> None:
        self.power_w = power_w
        self.t0 = time.monotonic()

    def read(self) -> EnergyReading:
        t = time.monotonic()
        return EnergyReading(t, {0: self.power_w * (t - self.t0)})

    def close(self) -> None:
        pass


class _StandInPlugin:
    @hookimpl
    def energy_router_meters(self):
        return {"standin-constant-power": ConstantPowerStandIn}


@pytest.fixture(scope="module", autouse=True)
def standin_meter():
    """The stand-in meter, registered with the plugin manager as a plugin would be for this module."""
    pm = get_plugin_manager()
    pm.register(_StandInPlugin(), name="test-standin-meter")
    yield
    pm.unregister(name="test-standin-meter")


@pytest.fixture(scope="module")
def backend():
    b = LocalBackend(TaskAnswers(ACC, TASKS, judge_model="judge-model"))
    b.start()
    yield b
    b.stop()


def config(backend: LocalBackend, tasks=SEVEN, cands=("small", "medium", "large"), model_prefix=None, **over):
    extra = lambda c: {"model": f"{model_prefix}/{c}"} if model_prefix else {}  # noqa: E731
    data = {
        "candidates": [backend.deployment(c, energy_profile_key=PROFILE_KEY[c], **extra(c)) for c in cands],
        "tasks": [{"name": t, "source": str(TASKS / f"{t}.jsonl")} for t in tasks],
        "judge": {
            "model_name": "judge",
            "litellm_params": {"model": "openai/judge-model", "api_base": backend.base_url, "api_key": "x"},
        },
        "concurrency": 4,
        "generation": {"num_retries": 0},
        "sandbox": {"timeout_s": 5},
        **over,
    }
    return parse_tournament_config(data)


def run(cfg, store, jobs=None, **kw):
    t = Tournament(cfg, store, **kw)
    try:
        return asyncio.run(t.run(jobs if jobs is not None else build_jobs(cfg)))
    finally:
        t.close()


@pytest.mark.slow
def test_end_to_end_seven_tasks_three_candidates(backend, sqlite_url):
    cfg = config(backend)
    store = open_store(sqlite_url)
    log0, judge0 = len(backend.answers.log), backend.answers.judge_calls
    summary = run(cfg, store)
    assert summary.complete and summary.written == 3 * 7 * 8
    rows = list(store.iter_runs())
    assert len(rows) == 168 and store.count_runs() == 168
    intended = {(m, q): ok for m, q, ok in backend.answers.log[log0:]}
    assert len(intended) == 168  # every pair asked exactly once
    profile = load_profile()
    for r in rows:
        # every grader scored every pair exactly as the server meant it (MT-Bench via the judge deployment)
        assert r["score"] == (1.0 if intended[(r["candidate"], r["query_id"])] else 0.0), r
        assert r["status"] == "success" and r["source"] == "tournament" and r["energy_method"] == "estimate"
        assert 0 < r["ttft_s"] <= r["latency_s"] and r["prompt_tokens"] > 0 and r["completion_tokens"] > 0
        expect = profile.estimate_j(PROFILE_KEY[r["candidate"]], r["prompt_tokens"], r["completion_tokens"])
        assert r["energy_j"] == pytest.approx(expect)
        assert r["avg_power_w"] == pytest.approx(r["energy_j"] / r["latency_s"])
        assert r["text"] and r["task"] == r["query_id"].split(":")[0]
    assert backend.answers.judge_calls - judge0 == 3 * 8
    # graded accuracy per candidate matches the server's setting within sampling error (3 sigma, n=56)
    stats = {s.candidate: s for s in store.stats()}
    for c, per_task in ACC.items():
        p = sum(per_task[t] for t in SEVEN) / 7
        assert abs(stats[c].accuracy - p) <= 3 * math.sqrt(p * (1 - p) / 56), (c, stats[c].accuracy, p)
        assert summary.candidates[c].accuracy == pytest.approx(stats[c].accuracy)
    assert stats["small"].accuracy < stats["medium"].accuracy < stats["large"].accuracy
    assert stats["small"].mean_energy_j < stats["medium"].mean_energy_j < stats["large"].mean_energy_j
    # a second run adds nothing and asks the server nothing
    n_log, n_judge = len(backend.answers.log), backend.answers.judge_calls
    again = run(cfg, store)
    assert again.written == 0 and all(s.skipped == 56 and s.total == 0 for s in again.candidates.values())
    assert store.count_runs() == 168 and len(backend.answers.log) == n_log and backend.answers.judge_calls == n_judge
    store.close()


def test_failed_requests_are_recorded_then_retried(backend, any_url):
    cfg = config(backend, tasks=["mmlu", "gsm8k"], cands=("small", "medium"))
    store = open_store(any_url)
    backend.fail_models = {"medium"}
    try:
        first = run(cfg, store)
    finally:
        backend.fail_models = set()
    assert first.candidates["medium"].failed == 16 and first.candidates["small"].failed == 0
    rows = {(r["candidate"], r["query_id"]): r for r in store.iter_runs()}
    assert len(rows) == 32
    failed = [r for r in rows.values() if r["candidate"] == "medium"]
    assert all(r["status"] == "failure" and r["score"] is None for r in failed)
    n = len(backend.answers.log)
    second = run(cfg, store)
    retried = backend.answers.log[n:]
    assert {m for m, _, _ in retried} == {"medium"} and len(retried) == 16  # only the failed pairs
    assert second.candidates["small"].skipped == 16 and second.candidates["medium"].done == 16
    rows = list(store.iter_runs())
    assert len(rows) == 32 and all(r["status"] == "success" for r in rows)
    store.close()


def test_meter_windows_split_concurrent_energy_without_double_counting(sqlite_url):
    slow = LocalBackend(TaskAnswers(ACC, TASKS, judge_model="judge-model"), delay_s=0.15)
    slow.start()
    try:
        cfg = config(
            slow,
            tasks=["mmlu", "gsm8k"],
            cands=("small", "large"),
            energy={"meter": "standin-constant-power", "options": {"power_w": 100.0}, "gpu": "stand-in GPU"},
        )
        store = open_store(sqlite_url)
        t0 = time.monotonic()
        summary = run(cfg, store)
        wall = time.monotonic() - t0
    finally:
        slow.stop()
    rows = list(store.iter_runs())
    assert summary.complete and len(rows) == 32
    assert all(r["energy_method"] == "power_sampling" and r["gpu"] == "stand-in GPU" for r in rows)
    total_j = sum(r["energy_j"] for r in rows)
    busy_j = 100.0 * sum(r["latency_s"] for r in rows)  # what per-request windows would sum to
    assert total_j <= 100.0 * wall  # conservation: never more than the meter measured (double counting breaks it)
    # overlapping windows share their energy: the rows sum to less than the sum of per-request windows
    # (how much less depends on how much the 4 concurrent requests overlapped on a loaded machine)
    assert total_j < 0.95 * busy_j
    assert all(0 < r["avg_power_w"] <= 100.0 + 1e-6 for r in rows)
    # one candidate at a time: the candidates' request windows do not overlap
    by = {c: [r for r in rows if r["candidate"] == c] for c in ("small", "large")}
    spans = sorted((min(r["created"] - r["latency_s"] for r in v), max(r["created"] for r in v)) for v in by.values())
    assert spans[0][1] <= spans[1][0] + 0.05
    store.close()


def test_config_errors_are_one_line(backend, tmp_path):
    with pytest.raises(ConfigError) as e:  # refused when the config is read, before any table is opened
        config(backend, energy={"meter": "no-such-meter"})
    assert "energy.meter' = 'no-such-meter': energy meter 'no-such-meter' is not registered (known: agent, " in str(
        e.value
    )
    assert "standin-constant-power" in str(e.value) and "\n" not in str(e.value)
    bad = config(backend)
    bad.candidates[0].energy_profile_key = None  # 'small' is not in the bundled profile
    with pytest.raises(ConfigError, match=r"no entry for candidate 'small'.*energy_profile_key"):
        Tournament(bad, open_store(f"sqlite:///{tmp_path / 'b.db'}"))
    with pytest.raises(ConfigError, match="mt_bench needs a judge"):
        build_jobs(config(backend, judge=None))
    with pytest.raises(ConfigError, match=r"candidate model_name 'small' appears twice"):
        config(backend, cands=("small", "small"))


def test_shadow_tournament_labels_production_queries(backend, any_url, tmp_path):
    store = open_store(any_url)
    privacy = PrivacySettings(store_text=False, salt="pepper")
    # the serving callback already wrote prod-1 (hashed text, no text) with its production run
    texts = {"prod-1": "Explain why the sea is salty.", "prod-2": "Give me three tips for a job interview."}
    store.write(
        candidates=[Candidate(name="small")],
        queries=[
            # created: the request's start, as the callback stores it and queues it
            make_query(
                "prod-1", "chat", texts["prod-1"], store_text=False, salt="pepper", source="production", created=1.7e9
            ),
            # prod-3's id names another request's query (a call id used twice): its entry is not run
            make_query("prod-3", "chat", "someone else's question", source="production", created=1.6e9),
        ],
        runs=[
            Run(
                query_id="prod-1",
                candidate="small",
                source="production",
                latency_s=1.0,
                status="success",
                context="ctx:00aa11bb22cc33dd|cl:3",  # what the proxy attributed to the request
            )
        ],
    )
    queue = tmp_path / "shadow.jsonl"
    lines = [
        {"query_id": q, "task": "chat", "text": t, "call_id": f"call-{q}", "created": 1.7e9} for q, t in texts.items()
    ]
    other = {"query_id": "prod-3", "task": "chat", "text": "my question", "call_id": "call-prod-3", "created": 1.7e9}
    queue.write_text("\n".join(json.dumps(x) for x in [*lines, lines[0], other]) + '\n{"query_id": "prod-4", "ta')
    entries = read_queue(queue)
    assert [e.query_id for e in entries] == ["prod-1", "prod-2", "prod-3"]  # duplicate dropped, half-written left
    cfg = config(backend)
    n = len(backend.answers.log)
    summary = run(cfg, store, source="shadow", jobs=shadow_jobs(entries, store, privacy))
    assert summary.complete
    shadow = [r for r in store.iter_runs(sources=["shadow"])]
    assert len(shadow) == 6 and len(backend.answers.log) - n == 6
    assert {r["query_id"] for r in shadow} == {"prod-1", "prod-2"}  # prod-3's entry is another request's: not run
    for r in shadow:
        want = backend.answers.correct(r["candidate"], texts[r["query_id"]], "open")
        assert r["score"] == (1.0 if want else 0.0) and r["call_id"] == f"call-{r['query_id']}"
        assert r["query_source"] == "production" and r["text"] is None  # privacy kept; production row untouched
        assert r["text_hash"] == text_hash(texts[r["query_id"]], "pepper")
        # the production run's context (prod-2 has no production run yet: none)
        assert r["context"] == ("ctx:00aa11bb22cc33dd|cl:3" if r["query_id"] == "prod-1" else None)
    assert len(list(store.iter_runs(sources=["production"]))) == 1
    again = run(cfg, store, source="shadow", jobs=shadow_jobs(read_queue(queue), store, privacy))
    assert again.written == 0 and len(backend.answers.log) - n == 6
    # queued a moment ago and not in the table yet (the writer may still be flushing it): a later run takes it
    fresh = ShadowEntry(query_id="prod-9", task="chat", text="just asked", call_id="c9", created=time.time())
    assert shadow_jobs([fresh], store, privacy) == []
    later = shadow_jobs([fresh], store, privacy, now=fresh.created + DEFER_S + 1)
    assert [(j.item.query_id, j.context) for j in later] == [("prod-9", None)]
    # without the proxies' salt (privacy.salt empty, no salt file where the proxy keeps it) the query is not
    # written with an unsalted hash: it waits; with the proxy's salt file it is hashed as the proxy hashes it
    from litellm_energy_router.litellm_glue.callback.private_files import load_or_create_salt, query_salt

    bare = PrivacySettings(store_text=False)
    assert query_salt(bare, tmp_path / "no-spool", create=False) is None
    assert shadow_jobs([fresh], store, bare, now=fresh.created + DEFER_S + 1, salt=None) == []
    proxy_salt = load_or_create_salt(tmp_path / "spool" / "salt")
    salt = query_salt(bare, tmp_path / "spool", create=False)
    (job,) = shadow_jobs([fresh], store, bare, now=fresh.created + DEFER_S + 1, salt=salt)
    assert salt == proxy_salt and job.query.text_hash == text_hash("just asked", proxy_salt)
    store.close()


class StandInVLLMEngine:
    """STAND-IN for ``vllm.LLM`` (vLLM cannot run without a GPU): answers each rendered prompt from
    the test backend's answer table, with whitespace tokens."""

    def __init__(self, backend: LocalBackend, model: str) -> None:
        self.backend, self.model = backend, model
        self.batches: list[int] = []
        self.unloaded = False

    def get_tokenizer(self):
        class Tok:
            @staticmethod
            def apply_chat_template(messages, tokenize=False, add_generation_prompt=True):
                return messages[-1]["content"]

        return Tok()

    def generate(self, prompts, params, use_tqdm=False):
        from types import SimpleNamespace as NS

        self.batches.append(len(prompts))
        time.sleep(0.05)
        outs = []
        for p, sp in zip(prompts, params):
            text = self.backend.answers.reply(self.model, p)[0]
            out = NS(text=text, token_ids=list(range(min(len(text.split()), sp["max_tokens"]))))
            outs.append(NS(prompt_token_ids=list(range(len(p.split()))), outputs=[out], metrics=None))
        return outs


def test_vllm_offline_driver_batches_and_splits_energy_by_tokens(backend, sqlite_url):
    cfg = config(
        backend,
        tasks=["mmlu", "gsm8k"],
        cands=("small", "large"),
        batch_size=5,
        prefill_token_weight=0.25,
        energy={"meter": "standin-constant-power"},
        mode="vllm_offline",
        model_prefix="stand-in",
    )
    engines = {}

    def factory(cand, _cfg):
        engines[cand.model_name] = StandInVLLMEngine(backend, cand.model_name)
        return engines[cand.model_name]

    driver = OfflineDriver(
        factory, params_factory=lambda _cfg, n: {"max_tokens": n}, unload_fn=lambda e: setattr(e, "unloaded", True)
    )
    store = open_store(sqlite_url)
    t = Tournament(cfg, store)
    summary = asyncio.run(t.run(build_jobs(cfg), driver=driver, sequential=True))
    assert summary.complete
    assert all(e.unloaded and e.batches == [5, 5, 5, 1] for e in engines.values())
    rows = list(store.iter_runs())
    assert len(rows) == 32 and all(r["energy_method"] == "power_sampling" for r in rows)
    # within a batch, joules are proportional to 0.25 * prompt tokens + output tokens
    first = [
        r for r in rows if r["candidate"] == "small" and r["task"] == "mmlu" and r["query_id"].split(":")[1] in "01234"
    ]
    ratios = [r["energy_j"] / (0.25 * r["prompt_tokens"] + r["completion_tokens"]) for r in first]
    assert len(first) == 5 and max(ratios) == pytest.approx(min(ratios))
    for r in rows:  # graded like any tournament row
        assert r["score"] == (1.0 if backend.answers.correct(r["candidate"], r["query_id"], r["task"]) else 0.0)
    store.close()


def test_example_config_parses(monkeypatch):
    from litellm_energy_router.profiling.config import load_tournament_config

    monkeypatch.setenv("OPENAI_API_KEY", "sk-example")
    cfg = load_tournament_config(Path(__file__).parents[1] / "config_examples" / "tournament.yaml")
    assert [t.name for t in cfg.tasks] == SEVEN and cfg.judge.litellm_params["api_key"] == "sk-example"
    assert cfg.concurrency_of(cfg.candidates[1]) == 16 and cfg.energy.meter == "estimate"
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConfigError, match=r"judge.litellm_params.api_key.*OPENAI_API_KEY"):
        load_tournament_config(Path(__file__).parents[1] / "config_examples" / "tournament.yaml")


def test_a_new_apps_first_requests_teach_its_context_prior_through_a_shadow_tournament(
    backend, planted_ckpt, any_url, tmp_path, fresh_litellm_callbacks
):
    """The loop end to end: a real Router + strategy + EnergyLogger with ``shadow.new_context_requests: 3`` queue the
    first three requests of each app; ``shadow_jobs`` + the runner (judge-graded) run them on every candidate under
    the app's context; the context prior fitted from the table then holds every candidate's rows for that app."""
    from collections import Counter

    import litellm
    from litellm import Router
    from router_fixtures import CANDS, loop_settings, pool_deployments

    from litellm_energy_router.litellm_glue.callback import EnergyLogger
    from litellm_energy_router.litellm_glue.litellm_compat import register_strategy
    from litellm_energy_router.litellm_glue.strategy import EnergyRouterCore, EnergyRoutingStrategy
    from litellm_energy_router.router.context import Context, ContextPrior

    queue = tmp_path / "shadow.jsonl"
    s = loop_settings(planted_ckpt, any_url, tmp_path, shadow={"new_context_requests": 3, "queue_path": str(queue)})
    logger = EnergyLogger(s)
    litellm.callbacks = [logger]
    router = Router(model_list=pool_deployments(backend))
    register_strategy(router, EnergyRoutingStrategy(router, core=EnergyRouterCore(s)))
    try:
        for i, app in enumerate("AAAAABB"):
            msgs = [{"role": "user", "content": f"Tell me about rivers, question {i}"}]
            router.completion(model="pool", messages=msgs, metadata={"user_api_key_alias": f"app-{app}"})
        deadline = time.monotonic() + 60
        while logger.writer.submitted < 7 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert logger.flush(30)
    finally:
        logger.close()
    entries = read_queue(queue)
    assert len(entries) == 5  # app-A's first three, app-B's two
    store = open_store(any_url)
    summary = run(config(backend), store, source="shadow", jobs=shadow_jobs(entries, store, PrivacySettings()))
    assert summary.complete and summary.written == 5 * 3
    prod = {r["query_id"]: r["context"] for r in store.iter_runs(sources=["production"])}
    shadow = list(store.iter_runs(sources=["shadow"]))
    assert all(r["context"] == prod[r["query_id"]] for r in shadow)
    prior = ContextPrior(CANDS)
    prior.fit_rows(store.iter_runs())
    store.close()
    served = Counter(Context.parse(c).key for c in prod.values())  # app-A: 5 requests, app-B: 2
    assert sorted(served.values()) == [2, 5]
    for key, n in served.items():  # each app's own level holds every candidate's judged rows of its shadowed ones
        assert prior.detail(Context(key, "cl:0"))[1].tolist() == [min(n, 3)] * 3


class _HostileUsage:
    """Answers right but reports usage no endpoint should: negative or absurdly large token counts."""

    BAD = [(-1, 5), (10, -7), (12, 10**10), (-3, -2)]

    def __init__(self, inner):
        self.inner, self.n = inner, 0

    def answer(self, name, messages):
        text, _ = self.inner.answer(name, messages)
        self.n += 1
        return text, self.BAD[self.n % len(self.BAD)]


def test_an_endpoint_reporting_impossible_token_counts_neither_stops_the_run_nor_is_written(sqlite_url):
    """The endpoint's usage is hostile input: each impossible count is replaced by LiteLLM's own count of the
    messages or the answer, every pair is written (the run used to stop on the first, with a traceback)."""
    with LocalBackend(_HostileUsage(TaskAnswers(ACC, TASKS, judge_model="judge-model"))) as b:
        cfg = config(b, tasks=["gsm8k"], cands=("small",))
        store = open_store(sqlite_url)
        summary = run(cfg, store)
        runs = list(store.iter_runs())
        store.close()
    assert summary.complete and len(runs) == summary.written == 8
    for r in runs:
        assert isinstance(r["prompt_tokens"], int) and 0 < r["prompt_tokens"] < 1e6
        assert isinstance(r["completion_tokens"], int) and 0 <= r["completion_tokens"] < 1e6


def test_a_configuration_error_inside_the_drivers_is_raised_as_itself(backend, sqlite_url):
    """A grader's configuration error stops the tournament as that error (one line at the CLI), not wrapped in the
    drivers' exception group; the pairs finished before it are written."""
    from litellm_energy_router.profiling.tasks import TaskError
    from litellm_energy_router.profiling.tasks.gsm8k import GSM8K

    calls = []
    orig = GSM8K.grade

    async def grade(self, item, text, ctx):
        calls.append(item.id)
        if len(calls) == 3:
            raise TaskError("gsm8k: the grader's configuration is broken")
        return await orig(self, item, text, ctx)

    cfg = config(backend, tasks=["gsm8k"], cands=("small",), concurrency=1)
    store = open_store(sqlite_url)
    GSM8K.grade = grade
    try:
        with pytest.raises(TaskError, match="configuration is broken"):
            run(cfg, store)
    finally:
        GSM8K.grade = orig
    assert sum(1 for _ in store.iter_runs()) == 2
    store.close()


def test_the_tournaments_nvml_meter_reads_the_gpus_the_energy_section_names(backend, tmp_path, monkeypatch):
    """``energy.gpus: [0]`` on a 4-GPU node (a documented key the tournament accepted) was dropped: the meter summed
    every GPU of the host (510 J for a 1 s request at 300 W beside three idle GPUs). The meter reads GPU 0 only; an
    explicit ``energy.options`` still wins. ``meter: agent`` (an answer per request, not a counter) is refused in one
    line (it failed with a constructor's TypeError)."""
    import sys

    from fake_pynvml import FakeGPU, make_fake_pynvml

    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml([FakeGPU(power_w=300.0)] + [FakeGPU(power_w=70.0)] * 3))
    store = open_store(f"sqlite:///{tmp_path / 't.db'}")
    t = Tournament(config(backend, energy={"meter": "nvml", "gpus": [0]}), store)
    assert t.accountant.meter.indices == [0]
    t.close()
    t = Tournament(config(backend, energy={"meter": "nvml", "gpus": [0], "options": {"gpus": [1, 2]}}), store)
    assert t.accountant.meter.indices == [1, 2]
    t.close()
    with pytest.raises(ConfigError, match="a tournament reads the GPU counter"):
        Tournament(config(backend, energy={"meter": "agent", "agent_url": "http://127.0.0.1:9400"}), store)
    store.close()


def test_the_router_is_built_before_the_first_metered_window_opens(backend, sqlite_url):
    """The Router was built (and LiteLLM imported) lazily inside the first pair's window: its joules, latency and TTFT
    were the build's (1,440 J at 300 W for a 0.75 s first pair against ~30 J for the next)."""
    cfg = config(backend, tasks=("mmlu",), cands=("small",))
    store = open_store(sqlite_url)
    t = Tournament(cfg, store)
    built_at_first_window = []
    begin = t.accountant.begin

    def first_begin():
        if not built_at_first_window:
            built_at_first_window.append(t._router is not None)
        return begin()

    t.accountant.begin = first_begin
    asyncio.run(t.run(build_jobs(cfg)))
    t.close()
    assert built_at_first_window == [True]
    store.close()
