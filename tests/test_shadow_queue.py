"""Shadow sampling: the queue file format (fixed in ShadowSettings) and exactly-once queuing through
the writer, including rows that took the spool path."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest
from router_fixtures import served_row

from litellm_energy_router.energy.estimate import EstimateMeter
from litellm_energy_router.litellm_glue.callback import TableWriter, query_id_for
from litellm_energy_router.litellm_glue.callback.shadow_queue import ShadowQueue, sampled
from litellm_energy_router.settings import PrivacySettings, WriterSettings
from litellm_energy_router.table import open_store


def test_sampling_fraction_is_deterministic():
    keys = [f"call-{i}" for i in range(20000)]
    share = sum(sampled(k, 0.1) for k in keys) / len(keys)
    assert 0.09 < share < 0.11
    assert [sampled(k, 0.1) for k in keys[:100]] == [sampled(k, 0.1) for k in keys[:100]]
    assert not any(sampled(k, 0.0) for k in keys[:100]) and all(sampled(k, 1.0) for k in keys[:100])


def test_a_caller_cannot_choose_call_ids_that_are_always_sampled(tmp_path):
    """Ids a caller found offline to be sampled by the plain hash are sampled at the configured rate, not always,
    once the writer's salt keys it (each sampled query runs on every candidate and the judge)."""
    crafted = [c for c in (f"attacker-{i}" for i in range(40000)) if sampled(c, 0.01)][:200]
    assert len(crafted) == 200
    q = ShadowQueue(tmp_path / "shadow.jsonl", 0.01)
    queued = sum(q.maybe_enqueue(f"q-{c}", "production", "expensive", c, secret="the-writers-salt") for c in crafted)
    assert queued <= 10  # 200 x 0.01 = 2 expected
    assert [sampled(c, 0.01, "s") for c in crafted] == [sampled(c, 0.01, "s") for c in crafted]  # a replay agrees


def test_queue_format(tmp_path):
    q = ShadowQueue(tmp_path / "sub" / "shadow.jsonl", 1.0)
    assert q.maybe_enqueue("prod-1", "production", "What is 2+2?\nünïcode", "1", created=123.5)
    q.enqueue("prod-2", "production", "x", None)
    assert stat.S_IMODE((tmp_path / "sub" / "shadow.jsonl").stat().st_mode) == 0o600  # it holds query text
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
        served_row(
            i,
            call_id=f"c{i}",
            status="failure" if i % 10 == 0 else "success",
            text=f"query {i}",
            start_s=10.0 + i,
            end_s=11.0 + i,
            prompt_tokens=3,
            completion_tokens=2,
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
    want = [r for r in rows if r.status == "success" and sampled(r.call_id, 0.5, w.salt)]  # keyed by the salt
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


def test_first_requests_of_each_new_context_are_queued(tmp_path):
    """``new_context_requests``: the first N requests of each context key, whatever the fraction; never a request
    without a key (its text cluster alone), nor one of a key past its first N; counted per key and per owner."""
    path = tmp_path / "shadow.jsonl"
    q = ShadowQueue(path, 0.0, new_context_requests=3)
    a, b = "ctx:00aa11bb22cc33dd|cl:3", "ctx:ffee00112233aabb|cl:3"
    offered = [("a", a)] * 5 + [("b", b)] * 2 + [("cl", "cl:3"), ("none", None), ("bad", "ctx:1|ctx:2|cl:1")]
    got = [
        q.maybe_enqueue(f"prod-{n}{i}", "production", "t", f"{n}{i}", context=c, owner=n)
        for i, (n, c) in enumerate(offered)
    ]
    assert got == [True] * 3 + [False] * 2 + [True] * 2 + [False] * 3
    assert [e["call_id"] for e in map(json.loads, path.read_text().splitlines())] == ["a0", "a1", "a2", "b5", "b6"]
    # one authenticated key: N over all its contexts, however it varies its system prompt (part of the key)
    owned = [f"ctx:{i:016x}|cl:1" for i in range(6)]
    got = [
        q.maybe_enqueue(f"prod-k{i}", "production", "t", f"k{i}", context=c, owner="key-1") for i, c in enumerate(owned)
    ]
    assert got == [True] * 3 + [False] * 3
    assert q.maybe_enqueue("prod-o", "production", "t", "o", context=owned[0], owner="key-2")  # its own budget
    # no authenticated key (an open proxy, the SDK): the contexts differ only by the caller's system prompt, so all
    # such requests share one owner's N, however many system prompts they send
    anon = [f"ctx:{i + 100:016x}|cl:2" for i in range(6)]
    got = [q.maybe_enqueue(f"prod-n{i}", "production", "t", f"n{i}", context=c) for i, c in enumerate(anon)]
    assert got == [True] * 3 + [False] * 3
    with pytest.raises(ValueError, match="new_context_requests = -1"):
        ShadowQueue(path, 0.0, new_context_requests=-1)


def test_a_failed_write_gives_its_new_context_slot_back(tmp_path):
    """A request whose queue write failed (here: the queue path is a directory) used none of its context's or its
    key's first N: once the queue is writable, the next N requests of that context are queued."""
    (tmp_path / "blocked").mkdir()
    q = ShadowQueue(tmp_path / "blocked", 0.0, new_context_requests=2)
    ctx = "ctx:00aa11bb22cc33dd|cl:3"
    for i in range(3):
        with pytest.raises(OSError):
            q.maybe_enqueue(f"prod-f{i}", "production", "t", f"f{i}", context=ctx, owner="key-1")
    q.path = tmp_path / "shadow.jsonl"
    got = [q.maybe_enqueue(f"prod-{i}", "production", "t", str(i), context=ctx, owner="key-1") for i in range(4)]
    assert got == [True, True, False, False]
    assert q.enqueued == 2


def test_only_a_slot_taken_counts_against_a_context(tmp_path):
    """A request turned away uses no slot: not one offered while another request's write holds the context's last
    slot (that write then fails: the next request gets it), nor one refused because its key had its N already (another
    key's request for that context still gets the context's slot)."""
    q = ShadowQueue(tmp_path / "shadow.jsonl", 0.0, new_context_requests=1)
    x, y = "ctx:00aa11bb22cc33dd|cl:3", "ctx:ffee00112233aabb|cl:3"
    held = q._new_context(x, None)  # request A's slot, its write in flight
    assert held and not q.maybe_enqueue("prod-b", "production", "t", "b", context=x)  # B: the slot is A's
    q._give_back(held)  # A's write failed
    assert q.maybe_enqueue("prod-c", "production", "t", "c", context=x)  # C gets it
    assert q.maybe_enqueue("prod-d", "production", "t", "d", context=y, owner="key-1")  # key-1's one
    assert not q.maybe_enqueue("prod-e", "production", "t", "e", context="ctx:0123456789abcdef|cl:1", owner="key-1")
    assert q.maybe_enqueue("prod-f", "production", "t", "f", context="ctx:0123456789abcdef|cl:1", owner="key-2")
    assert [json.loads(line)["call_id"] for line in q.path.read_text().splitlines()] == ["c", "d", "f"]


def test_an_existing_world_readable_queue_is_narrowed(tmp_path):
    path = tmp_path / "shadow.jsonl"
    path.write_text("")
    os.chmod(path, 0o644)
    ShadowQueue(path, 1.0).maybe_enqueue("prod-1", "production", "secret prompt", "1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_writer_queues_a_new_apps_first_requests(sqlite_url, tmp_path):
    """Through the callback's writer: each row's stored context decides (``shadow.new_context_requests``)."""
    path = tmp_path / "shadow.jsonl"
    cfg = WriterSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.05)
    shadow = ShadowQueue(path, 0.0, new_context_requests=2)
    w = TableWriter(sqlite_url, EstimateMeter(), writer=cfg, privacy=PrivacySettings(), shadow=shadow)
    ctx = {"a": "ctx:00aa11bb22cc33dd|cl:3", "b": "ctx:ffee00112233aabb|cl:5", "-": "cl:5"}
    for i, app in enumerate("aaaab--b"):
        row = served_row(i, call_id=f"{app}{i}")
        row.context, row.key_hash = ctx[app], f"key-{app}"
        w.submit(row)
    w.close()
    got = [json.loads(x)["call_id"] for x in path.read_text().splitlines()]
    assert got == ["a0", "a1", "b4", "b7"]


def test_requests_with_no_identity_share_one_new_context_budget(sqlite_url, tmp_path):
    """Through the writer: rows with no key hash count against their alias (an SDK app's own metadata); rows with no
    identity at all (an open proxy: the context differs only by the caller's system prompt) share one budget, so
    varying the system prompt queues no more than N for every candidate to run."""
    path = tmp_path / "shadow.jsonl"
    cfg = WriterSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.05)
    w = TableWriter(
        sqlite_url, EstimateMeter(), writer=cfg, privacy=PrivacySettings(), shadow=ShadowQueue(path, 0.0, 2)
    )
    for i in range(6):  # six system prompts, no identity
        row = served_row(i, call_id=f"n{i}")
        row.context = f"ctx:{i:016x}|cl:1"
        w.submit(row)
    for i, alias in enumerate("xxxy"):  # one app per alias: its own budget
        row = served_row(10 + i, call_id=f"{alias}{i}")
        row.context, row.key_alias = f"ctx:{0xA0 + i:016x}|cl:1", alias
        w.submit(row)
    w.close()
    got = [json.loads(x)["call_id"] for x in path.read_text().splitlines()]
    assert got == ["n0", "n1", "x0", "x1", "y3"]


def test_the_queue_is_bounded(tmp_path):
    """The queue holds prompt text and was never bounded (20,000 entries: 9.8 MB, read whole on every run)."""
    q = ShadowQueue(tmp_path / "shadow.jsonl", 1.0, max_mb=300 / 2**20)  # 300 bytes
    for i in range(10):
        q.enqueue(f"prod-{i}", "production", "x" * 40, str(i))
    assert q.enqueued >= 1 and q.dropped == 10 - q.enqueued
    assert (tmp_path / "shadow.jsonl").stat().st_size <= 300


def test_trim_takes_out_what_a_tournament_ran_and_keeps_the_rest(tmp_path):
    """Entries a shadow tournament ran stayed in the file for ever (their prompts on disk after labelling); those it
    did not run (waiting for their production row) and those the proxies append during the trim stay, 0600."""
    import threading

    from litellm_energy_router.litellm_glue.callback.shadow_queue import trim_queue

    path = tmp_path / "shadow.jsonl"
    q = ShadowQueue(path, 1.0)
    for i in range(5):
        q.enqueue(f"prod-{i}", "production", f"question {i}", str(i))
    path.write_bytes(
        path.read_bytes() + b'{"query_id": "prod-torn", "ta'
    )  # a torn append: left out, as read_queue does
    late = threading.Timer(0.2, lambda: q.enqueue("prod-late", "production", "asked during the trim", "late"))
    late.start()
    assert trim_queue(path, {"prod-0", "prod-2", "prod-9"}, grace_s=0.5) == 2
    late.join()
    ids = [json.loads(x)["query_id"] for x in path.read_text().splitlines()]
    assert sorted(ids) == ["prod-1", "prod-3", "prod-4", "prod-late"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and not list(tmp_path.glob("*.trim-*"))
    assert trim_queue(tmp_path / "absent.jsonl", {"x"}) == 0


def test_on_a_proxy_that_checks_no_keys_every_request_shares_one_new_context_budget(tmp_path, monkeypatch):
    """A LiteLLM proxy without a master key (nor custom, JWT or OAuth2 auth) takes any bearer token and logs its hash
    as ``user_api_key_hash``: a caller sending a new token per request minted a new owner and context each time (6 of
    6 queued at N = 2). There every request is one owner's; with a master key, each key its own N again."""
    import sys
    import types

    proxy = types.ModuleType("litellm.proxy.proxy_server")  # the running proxy's globals, as LiteLLM sets them
    proxy.master_key, proxy.user_custom_auth, proxy.general_settings = None, None, {}
    monkeypatch.setitem(sys.modules, "litellm.proxy.proxy_server", proxy)
    q = ShadowQueue(tmp_path / "shadow.jsonl", 0.0, new_context_requests=2)

    def offer(i):
        return q.maybe_enqueue(f"prod-{i}", "production", "t", f"c{i}", context=f"ctx:{i:016x}|cl:1", owner=f"h{i}")

    assert [offer(i) for i in range(6)] == [True, True, False, False, False, False]
    proxy.master_key = "sk-master"
    assert [offer(i) for i in range(6, 9)] == [True, True, True]  # keys checked: each hash its own budget
    proxy.master_key, proxy.general_settings = None, {"enable_jwt_auth": True}
    assert offer(9)
