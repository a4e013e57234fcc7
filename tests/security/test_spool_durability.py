"""The writer's spool under faults (issue: trust in production, item 6): a large backlog drains reading
each spool byte once; the spool's size is capped, oldest rows dropped first and counted; a full queue
never makes the serving thread wait for the disk; a failed spool write is counted, logged and loses
nothing; the offset and the directory are fsynced; replaying the same rows twice leaves one row per
call and keeps its feedback."""

from __future__ import annotations

import json
import logging
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager

import pytest
from prometheus_client import REGISTRY
from router_fixtures import served_row
from sqlalchemy import create_engine, text

from litellm_energy_router.energy.estimate import EstimateMeter
from litellm_energy_router.feedback import apply_feedback
from litellm_energy_router.litellm_glue.callback import TableWriter
from litellm_energy_router.settings import PrivacySettings, WriterSettings
from litellm_energy_router.table import Run, make_query, open_store

CAND = "mistralai/mistral-7b-chat"


def _records(lo: int, hi: int) -> list[dict]:
    """Spool records in the documented format (``{"k": "row", "q": query, "r": run, "c": candidate}``)."""
    q = make_query("x", "production", "question", store_text=False, source="production", created=1000.0).model_dump()
    r = Run(
        query_id="x",
        candidate=CAND,
        source="production",
        latency_s=1.0,
        prompt_tokens=10,
        completion_tokens=5,
        energy_j=12.5,
        energy_method="estimate",
        call_id="x",
        status="success",
        created=1001.0,
    ).model_dump()
    return [
        {
            "k": "row",
            "q": {**q, "id": f"prod-call-{i}"},
            "r": {**r, "query_id": f"prod-call-{i}", "call_id": f"call-{i}"},
            "c": {"name": CAND},
        }
        for i in range(lo, hi)
    ]


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _rchar(tid: int) -> int:
    """Bytes the thread read through read(2)/pread(2) (files; not socket receives)."""
    for line in open(f"/proc/self/task/{tid}/io"):
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def _spool_bytes(d) -> int:
    return sum(p.stat().st_size for p in d.glob("spool-*.jsonl"))


def _call_ids(url: str) -> list[str]:
    store = open_store(url)
    ids = [r["call_id"] for r in store.iter_runs()]
    store.close()
    return ids


@pytest.mark.postgres
@pytest.mark.slow
def test_backlog_of_200k_rows_drains_in_one_pass(pg_url, tmp_path):
    """An outage left 200,000 rows in the writer's spool; the table returns. The writer thread reads
    the spool once (bytes read, counted by the kernel, about the spool's size), and every row lands."""
    n = 200_000
    spool = tmp_path / "spool"
    cfg = WriterSettings(spool_dir=spool, flush_interval_s=0.05)
    w = TableWriter(pg_url, EstimateMeter(), writer=cfg, privacy=PrivacySettings(), start=False)
    for lo in range(0, n, 20_000):
        w.spool.append(_records(lo, lo + 20_000))
    size = _spool_bytes(spool)
    w._thread.start()
    r0 = _rchar(w._thread.native_id)
    assert w.wait_replayed(900)
    read = _rchar(w._thread.native_id) - r0
    w.close()
    eng = create_engine(pg_url)
    with eng.connect() as c:
        rows, calls = c.execute(text("select count(*), count(distinct call_id) from er_runs")).one()
    eng.dispose()
    print(f"backlog {n} rows, {size / 2**20:.1f} MiB; writer thread read {read / 2**20:.1f} MiB")
    assert (rows, calls) == (n, n)
    assert read <= 1.1 * size + 8 * 2**20, f"read {read / size:.1f}x the spool"


def test_cap_drops_oldest_rows_and_counts_them(tmp_path):
    """Table down for good: the spool stays under ``spool_max_mb``; the oldest rows go first and every
    dropped row is counted; the newest reach the table when it returns."""
    n = 6000
    spool = tmp_path / "spool"
    cfg = WriterSettings(spool_dir=spool, spool_max_mb=1, batch_size=100, flush_interval_s=0.05, retry_max_s=0.2)
    url = f"sqlite:///{tmp_path / 'later' / 't.db'}"
    before = _metric("energy_router_spool_dropped_rows_total")
    w = TableWriter(url, EstimateMeter(), writer=cfg, privacy=PrivacySettings())
    for i in range(n):
        w.submit(served_row(i))
    assert w.flush(60)
    assert _spool_bytes(spool) <= 2**20
    dropped = _metric("energy_router_spool_dropped_rows_total") - before
    assert dropped > 0
    (tmp_path / "later").mkdir()
    assert w.wait_replayed(60)
    w.close()
    ids = sorted(int(c.removeprefix("call-")) for c in _call_ids(url))
    assert len(ids) + dropped == n
    assert ids == list(range(n - len(ids), n))  # the oldest were dropped


def test_full_queue_never_waits_for_the_spool(sqlite_url, tmp_path):
    """The spool is busy (its lock held, as by a long fsync): submitting into a full queue still
    returns at once — the serving event loop never waits on the disk — and no row is lost."""
    cfg = WriterSettings(spool_dir=tmp_path / "spool", queue_size=10, batch_size=5, flush_interval_s=0.05)
    w = TableWriter(sqlite_url, EstimateMeter(), writer=cfg, privacy=PrivacySettings(), start=False)
    done = threading.Event()

    def serve() -> None:
        for i in range(100):
            w.submit(served_row(i))
        done.set()

    with w.spool._lock:
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        returned = done.wait(10)
    t.join(30)
    assert returned, "submit() waited for the spool"
    w._thread.start()
    assert w.flush(30)
    w.close()
    assert len(set(_call_ids(sqlite_url))) == 100


@contextmanager
def _disk_full_after(limit: int):
    """Files of this process capped at ``limit`` bytes (RLIMIT_FSIZE): writes beyond fail with EFBIG,
    like ENOSPC on a full disk."""
    old_sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_sig)


def _wait_metric_above(name: str, before: float, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while _metric(name) <= before and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("path", ["batches", "full queue"])
def test_spool_write_failure_is_counted_logged_and_loses_nothing(tmp_path, caplog, path):
    """Table down and the spool's disk full after 64 KiB: the failure is counted and logged, the rows
    wait in memory (batches of the writer thread, or rows spilled from a full queue), and once the disk
    has room again every row reaches the table exactly once."""
    caplog.set_level(logging.WARNING)
    url = f"sqlite:///{tmp_path / 'later' / 't.db'}"
    cfg = WriterSettings(
        spool_dir=tmp_path / "spool",
        batch_size=50,
        flush_interval_s=0.05,
        retry_max_s=0.2,
        queue_size=10 if path == "full queue" else 10_000,
    )
    before = _metric("energy_router_spool_write_errors_total")
    w = TableWriter(url, EstimateMeter(), writer=cfg, privacy=PrivacySettings(), start=path == "batches")
    with _disk_full_after(64 * 1024):
        for i in range(1000):
            w.submit(served_row(i))
        _wait_metric_above("energy_router_spool_write_errors_total", before)
        if path == "batches":
            w.flush(1)
    assert _metric("energy_router_spool_write_errors_total") > before
    assert [r for r in caplog.records if r.levelno >= logging.ERROR and "spool" in r.getMessage()]
    (tmp_path / "later").mkdir()
    if path == "full queue":
        w._thread.start()
    assert w.flush(30)
    assert w.wait_replayed(30)
    w.close()
    ids = _call_ids(url)
    assert len(ids) == len(set(ids)) == 1000


def test_replaying_the_same_spool_twice_keeps_one_row_and_its_feedback(any_url, tmp_path):
    """A crash after the table committed a replayed batch but before the offset was saved replays it
    again: still one row per call, and a score given by feedback in between is kept."""
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    lines = [json.dumps(r) for r in _records(0, 40)]
    lines += [json.dumps({"k": "pending", **served_row(i).to_json()}) for i in range(40, 50)]
    data = "\n".join(lines) + "\n"
    cfg = WriterSettings(spool_dir=spool, flush_interval_s=0.05)
    for attempt in range(2):
        (spool / f"spool-deadhost-{attempt + 1}-1.jsonl").write_text(data)  # left by a dead process
        w = TableWriter(any_url, EstimateMeter(), writer=cfg, privacy=PrivacySettings())
        assert w.wait_replayed(30)
        w.close()
        if attempt == 0:
            store = open_store(any_url)
            assert apply_feedback(store, "call-3", 1.0) == 1 and apply_feedback(store, "call-45", 0.0) == 1
            store.close()
    store = open_store(any_url)
    runs = list(store.iter_runs())
    store.close()
    assert len(runs) == len({r["call_id"] for r in runs}) == 50
    score = {r["call_id"]: r["score"] for r in runs}
    assert score["call-3"] == 1.0 and score["call-45"] == 0.0


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_offset_file_and_directory_are_fsynced(tmp_path):
    """Traced system calls of a writer that spools and replays: the offset file is fsynced before its
    rename, the spool directory after the rename and after a spool file is created."""
    script = textwrap.dedent(f"""
        import pathlib
        from litellm_energy_router.litellm_glue.callback import PendingRow, TableWriter
        from litellm_energy_router.energy.estimate import EstimateMeter
        from litellm_energy_router.settings import PrivacySettings, WriterSettings
        d = pathlib.Path({str(tmp_path)!r})
        cfg = WriterSettings(spool_dir=d / "spool", batch_size=5, flush_interval_s=0.05, retry_max_s=0.1)
        w = TableWriter(f"sqlite:///{{d / 'later' / 't.db'}}", EstimateMeter(), writer=cfg, privacy=PrivacySettings())
        for i in range(20):
            w.submit(PendingRow(f"c{{i}}", "m", "success", "q", 1.0, 2.0, None, 1, 1, None, None, None))
        assert w.flush(20)
        (d / "later").mkdir()
        assert w.wait_replayed(20)
        w.close()
    """)
    trace = tmp_path / "trace.txt"
    cmd = [
        "strace",
        "-f",
        "-y",
        "-qq",
        "-o",
        str(trace),
        "-e",
        "trace=openat,fsync,fdatasync,rename,renameat,renameat2",
        sys.executable,
        "-c",
        script,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    spool = str(tmp_path / "spool")
    calls = [ln.split(None, 1)[1] for ln in trace.read_text().splitlines() if spool in ln and "resumed" not in ln]
    dir_sync = [i for i, c in enumerate(calls) if c.startswith(("fsync(", "fdatasync(")) and f"<{spool}>" in c]
    created = [i for i, c in enumerate(calls) if c.startswith("openat(") and "O_CREAT" in c and '.jsonl"' in c]
    renames = [i for i, c in enumerate(calls) if c.startswith("rename") and ".offset" in c]
    assert created and renames
    assert any(j > created[0] for j in dir_sync), "directory not fsynced after a spool file was created"
    assert any(j > renames[0] for j in dir_sync), "directory not fsynced after the offset rename"
    tmp_syncs = [i for i, c in enumerate(calls) if c.startswith(("fsync(", "fdatasync(")) and ".offset" in c]
    assert tmp_syncs and tmp_syncs[0] < renames[0], "offset file not fsynced before its rename"


def test_a_row_the_table_cannot_take_is_set_aside_and_the_rest_go_on(any_url, tmp_path):
    """With privacy.store_text, a caller's text holding a lone surrogate (valid JSON) or a NUL (PostgreSQL's text
    refuses it) is stored readable; and a spool line that is JSON but not a record (an edited or damaged spool) goes
    to rejected.jsonl while the rows after it are replayed. Either used to stop every later write (the batch taken
    for a table outage, retried for ever)."""
    from litellm_energy_router.table import TableError

    def down(url):
        raise TableError("down")

    ws = WriterSettings(spool_dir=tmp_path / "spool", retry_max_s=0.2, flush_interval_s=0.05)
    w = TableWriter(any_url, EstimateMeter(), writer=ws, privacy=PrivacySettings(), store_factory=down)
    w.submit(served_row(0))
    w.flush()
    w.close(timeout=1)
    (seg,) = (tmp_path / "spool").glob("spool-*.jsonl")
    seg.write_text("".join(f"{bad}\n" for bad in ('{"k": "pending"}', '{"k": "row"}', "[1]")) + seg.read_text())
    w = TableWriter(any_url, EstimateMeter(), writer=ws, privacy=PrivacySettings(store_text=True))
    w.submit(served_row(1, text="lone \ud800 surrogate"))
    w.submit(served_row(2, text="nul \x00 byte"))
    w.submit(served_row(3))
    w.flush(10)
    assert w.wait_replayed(10)
    w.close(timeout=5)
    store = open_store(any_url)
    texts = {r["call_id"]: r["text"] for r in store.iter_runs()}
    store.close()
    assert set(texts) == {"call-0", "call-1", "call-2", "call-3"}, texts
    assert texts["call-1"] == "lone ? surrogate" and texts["call-2"] == "nul \ufffd byte"
    rejected = [json.loads(line) for line in (tmp_path / "spool" / "rejected.jsonl").read_text().splitlines()]
    reasons = sorted(r["reason"].split(" in ")[0].split(":")[0] for r in rejected)
    assert reasons == ["malformed spool record", "malformed spool record", "unparsable line"], rejected


def test_a_shadow_queue_line_torn_by_a_full_disk_is_cut_off(tmp_path):
    """The shadow queue's append fails half way on a full disk: the torn line is cut back off, so the next entry starts
    a line of its own and the queue stays readable (a torn line used to glue onto the next and fail the whole file)."""
    from litellm_energy_router.profiling.shadow_tournament import read_queue

    from litellm_energy_router.litellm_glue.callback.shadow_queue import ShadowQueue

    path = tmp_path / "shadow" / "queue.jsonl"
    q = ShadowQueue(path, fraction=1.0)
    q.enqueue("prod-a", "production", "first", "a", 1.0)
    size = path.stat().st_size
    with _disk_full_after(size + 40), pytest.raises(OSError):
        q.enqueue("prod-b", "production", "x" * 200, "b", 2.0)
    q.enqueue("prod-c", "production", "third", "c", 3.0)
    assert [e.query_id for e in read_queue(path)] == ["prod-a", "prod-c"]
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
