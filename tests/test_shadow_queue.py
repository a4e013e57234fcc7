"""Shadow sampling: the queue file format (fixed in ShadowSettings) and exactly-once queuing through
the writer, including rows that took the spool path."""

from __future__ import annotations

import json
import time

from litellm_energy_router.energy.estimate import EstimateMeter
from litellm_energy_router.litellm_glue.callback import PendingRow, TableWriter, query_id_for
from litellm_energy_router.settings import PrivacySettings, WriterSettings
from litellm_energy_router.shadow_queue import ShadowQueue, sampled
from litellm_energy_router.table import open_store


def test_sampling_fraction_is_deterministic():
    keys = [f"call-{i}" for i in range(20000)]
    share = sum(sampled(k, 0.1) for k in keys) / len(keys)
    assert 0.09 < share < 0.11
    assert [sampled(k, 0.1) for k in keys[:100]] == [sampled(k, 0.1) for k in keys[:100]]
    assert not any(sampled(k, 0.0) for k in keys[:100]) and all(sampled(k, 1.0) for k in keys[:100])


def test_queue_format(tmp_path):
    q = ShadowQueue(tmp_path / "sub" / "shadow.jsonl", 1.0)
    assert q.maybe_enqueue("prod-1", "production", "What is 2+2?\nünïcode", "1", created=123.5)
    q.enqueue("prod-2", "production", "x", None)
    lines = [json.loads(x) for x in (tmp_path / "sub" / "shadow.jsonl").read_text().splitlines()]
    assert lines[0] == {
        "query_id": "prod-1",
        "task": "production",
        "text": "What is 2+2?\nünïcode",
        "call_id": "1",
        "created": 123.5,
    }
    assert set(lines[1]) == {"query_id", "task", "text", "call_id", "created"} and lines[1]["call_id"] is None
    assert isinstance(lines[1]["created"], float)


def test_writer_queues_each_sampled_success_once(sqlite_url, tmp_path):
    path = tmp_path / "shadow.jsonl"
    cfg = WriterSettings(spool_dir=tmp_path / "spool", queue_size=20, batch_size=10, flush_interval_s=0.05)
    w = TableWriter(
        sqlite_url, EstimateMeter(), writer=cfg, privacy=PrivacySettings(), shadow=ShadowQueue(path, 0.5), start=False
    )
    rows = [
        PendingRow(
            call_id=f"c{i}",
            candidate="mistralai/mistral-7b-chat",
            status="failure" if i % 10 == 0 else "success",
            text=f"query {i}",
            start_s=10.0 + i,
            end_s=11.0 + i,
            first_token_s=None,
            prompt_tokens=3,
            completion_tokens=2,
            propensity=None,
            deployment_id="d",
            backend_id=None,
        )
        for i in range(200)
    ]
    for r in rows:
        w.submit(r)  # the thread is not running yet: 180 of them spill to the spool as pending rows
    deadline = time.monotonic() + 30
    while w.spooled < 180 and time.monotonic() < deadline:  # spilled by a thread of its own
        time.sleep(0.02)
    assert w.spooled == 180
    w._thread.start()
    w.close()
    store = open_store(sqlite_url)
    assert store.count_runs() == 200
    store.close()
    got = [json.loads(x) for x in path.read_text().splitlines()]
    want = [r for r in rows if r.status == "success" and sampled(r.call_id, 0.5)]
    assert sorted(g["call_id"] for g in got) == sorted(r.call_id for r in want)
    assert len({g["call_id"] for g in got}) == len(got)  # once each
    by = {g["call_id"]: g for g in got}
    for r in want:
        assert by[r.call_id]["query_id"] == query_id_for(r.call_id)
        assert by[r.call_id]["text"] == r.text and by[r.call_id]["task"] == "production"


def test_profiler_reads_our_queue(tmp_path):
    """The contract with the shadow tournament (profiling.shadow_tournament.read_queue)."""
    from litellm_energy_router.profiling.shadow_tournament import read_queue

    path = tmp_path / "shadow.jsonl"
    q = ShadowQueue(path, 1.0)
    for i in range(3):
        q.maybe_enqueue(query_id_for(f"c{i}"), "production", f"text {i}", f"c{i}", created=50.0 + i)
    entries = read_queue(path)
    assert [(e.query_id, e.task, e.text, e.call_id, e.created) for e in entries] == [
        (f"prod-c{i}", "production", f"text {i}", f"c{i}", 50.0 + i) for i in range(3)
    ]
