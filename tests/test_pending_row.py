"""Turning LiteLLM callback kwargs into rows (pure parts), and the callback's Prometheus metrics."""

from __future__ import annotations

from datetime import datetime, timezone

from prometheus_client import REGISTRY, generate_latest

from litellm_energy_router.energy.estimate import EstimateMeter
from litellm_energy_router.litellm_glue.callback import CandidateMap, PendingRow, TableWriter, extract_row
from litellm_energy_router.litellm_glue.decision import Decision
from litellm_energy_router.litellm_glue.request_text import query_text as routed_text
from litellm_energy_router.settings import CandidateSettings, PrivacySettings, WriterSettings

CMAP = CandidateMap(
    [
        CandidateSettings(name="small", deployment_id="dep-small", model="openai/small-model", params_b=7),
        CandidateSettings(name="big", model="openai/big-model"),
    ]
)


def kwargs(model_id="dep-small", model="openai/small-model", **slo):
    md = {}
    base = {
        "litellm_call_id": "c1",
        "id": "chatcmpl-9",
        "model_id": model_id,
        "model": model,
        "prompt_tokens": 12,
        "completion_tokens": 7,
        "startTime": 100.0,
        "endTime": 101.5,
        "completionStartTime": 100.4,
        "messages": [{"role": "user", "content": "hi"}],
        "status": "success",
    }
    base.update(slo)
    return {
        "standard_logging_object": base,
        "litellm_params": {"metadata": md},
        "litellm_call_id": base["litellm_call_id"],
    }


def test_candidate_resolution():
    assert CMAP.resolve("dep-small", "openai/whatever", None, None) == "small"  # by deployment id
    assert CMAP.resolve("dep-x", "openai/big-model", None, None) == "big"  # by model
    assert CMAP.resolve("dep-x", "openai/small", None, None) == "small"  # provider prefix stripped
    assert CMAP.resolve("dep-x", "openai/other", None, None) == "openai/other"  # unknown: the model string
    assert CMAP.resolve("dep-x", "openai/other", "big", None) == "big"  # the router's choice
    assert CMAP.resolve("dep-x", "openai/other", "big", "dep-y") == "openai/other"  # choice was another deployment
    assert CMAP.info["small"]["params_b"] == 7


def test_extract_row_fields():
    d = Decision(candidate="small", propensity=0.7, router_version="v3")
    r = extract_row(kwargs(), None, None, "success", CMAP, d)
    assert (r.call_id, r.candidate, r.status, r.text) == ("c1", "small", "success", "hi")
    assert (r.start_s, r.end_s, r.first_token_s) == (100.0, 101.5, 100.4)
    assert (r.prompt_tokens, r.completion_tokens, r.propensity) == (12, 7, 0.7)
    assert (r.deployment_id, r.backend_id) == ("dep-small", "chatcmpl-9")
    # served deployment differs from the decision: no propensity for this candidate
    r = extract_row(kwargs(model_id="dep-x", model="openai/big-model"), None, None, "success", CMAP, d)
    assert r.candidate == "big" and r.propensity is None
    # times from the callback arguments when the logging object lacks them; TTFT outside the span dropped
    st, et = datetime(2026, 1, 1, tzinfo=timezone.utc), datetime(2026, 1, 1, 0, 0, 2, tzinfo=timezone.utc)
    r = extract_row(kwargs(startTime=None, endTime=None, completionStartTime=5.0), st, et, "success", CMAP)
    assert r.end_s - r.start_s == 2.0 and r.first_token_s is None
    # a failure before any deployment was chosen is not a candidate's row
    assert extract_row(kwargs(model_id=None, model="pool"), None, None, "failure", CMAP) is None
    assert extract_row({"standard_logging_object": {}}, None, None, "success", CMAP) is None


def test_row_text_is_what_the_router_reads():
    msgs = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {}},
                {"type": "text", "text": "b"},
            ],
        },
    ]
    r = extract_row(kwargs(messages=msgs), None, None, "success", CMAP)
    assert r.text == routed_text(msgs) == "be brief\n\na\nb"
    r = extract_row({**kwargs(messages=None), "prompt": "complete this"}, None, None, "success", CMAP)
    assert r.text == "complete this"


def test_model_info_tag_wins():
    kw = kwargs(model_id="dep-small")
    kw["litellm_params"]["metadata"]["model_info"] = {"id": "dep-small", "energy_router_candidate": "tagged-name"}
    assert extract_row(kw, None, None, "success", CMAP).candidate == "tagged-name"


def test_metrics_exposed(sqlite_url, tmp_path):
    w = TableWriter(
        sqlite_url, EstimateMeter(), writer=WriterSettings(spool_dir=tmp_path / "s"), privacy=PrivacySettings()
    )
    w.submit(
        PendingRow(
            call_id="m1",
            candidate="mistralai/mistral-7b-chat",
            status="success",
            text="x",
            start_s=1.0,
            end_s=2.0,
            first_token_s=None,
            prompt_tokens=10,
            completion_tokens=10,
            propensity=None,
            deployment_id=None,
            backend_id=None,
        )
    )
    w.submit(
        PendingRow(
            call_id="m2",
            candidate="not-in-profile",
            status="success",
            text="x",
            start_s=1.0,
            end_s=2.0,
            first_token_s=None,
            prompt_tokens=10,
            completion_tokens=10,
            propensity=None,
            deployment_id=None,
            backend_id=None,
        )
    )
    w.close()
    text = generate_latest(REGISTRY).decode()
    assert (
        'energy_router_request_joules_bucket{candidate="mistralai/mistral-7b-chat",le="2.5",method="estimate"}' in text
    )
    assert 'energy_router_rows_total{method="none"}' in text  # no profile entry: row kept without energy
    for name in (
        "energy_router_writer_queue_depth",
        "energy_router_spool_backlog_rows",
        "energy_router_spooled_rows_total",
        "energy_router_rows_written_total",
        "energy_router_measured_energy_ratio",
    ):
        assert name in text


def test_measured_split_is_the_meter_registrys_answer():
    """The ledger's and the metrics' measured / estimated split: a meter that declares it measures (``nvml``,
    ``agent``) is measured; the ``simulated`` stand-in and the token estimate are not (the split used to count
    every method but ``estimate`` as measured)."""
    from router_fixtures import served_row

    from litellm_energy_router.energy.meter import RequestEnergy
    from litellm_energy_router.litellm_glue.callback.accounting import RowAccounting
    from litellm_energy_router.metrics import MEASURED_ENERGY_RATIO, observe_row

    row = served_row(0)
    split = {}
    for method in ("nvml_counter", "power_sampling", "agent", "simulated", "estimate"):
        _, entry = RowAccounting().settle(row, RequestEnergy(5.0, method))
        split[method] = (entry["joules_measured"], entry["joules_estimated"])
    assert split == {
        "nvml_counter": (5.0, 0.0),
        "power_sampling": (5.0, 0.0),
        "agent": (5.0, 0.0),
        "simulated": (0.0, 5.0),
        "estimate": (0.0, 5.0),
    }
    for _ in range(3):
        observe_row("c", "simulated", 1.0, False)
    assert MEASURED_ENERGY_RATIO._value.get() < 1.0
    before = MEASURED_ENERGY_RATIO._value.get()
    observe_row("c", "nvml_counter", 1.0, True)
    assert MEASURED_ENERGY_RATIO._value.get() > before
