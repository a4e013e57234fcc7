"""Feedback: scores for production rows by LiteLLM call id (core, HTTP endpoint, CLI); unknown ids
and out-of-range scores are rejected without writing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from router_fixtures import served_row

from litellm_energy_router.energy.estimate import EstimateMeter
from litellm_energy_router.feedback import FeedbackError, apply_feedback, feedback_app
from litellm_energy_router.litellm_glue.callback import TableWriter
from litellm_energy_router.settings import PrivacySettings, WriterSettings
from litellm_energy_router.table import open_store
from litellm_energy_router.threaded_app import ThreadedApp

EXE = str(Path(sys.executable).with_name("energy-router"))


@pytest.fixture
def table(any_url, tmp_path):
    w = TableWriter(
        any_url, EstimateMeter(), writer=WriterSettings(spool_dir=tmp_path / "spool"), privacy=PrivacySettings()
    )
    for i in range(3):
        w.submit(_row(i))
    w.submit(_row(9, status="failure"))
    w.close()
    store = open_store(any_url)
    yield any_url, store
    store.close()


def _snapshot(store):
    return {
        r["call_id"]: (r["score"], r["energy_j"], r["latency_s"], r["propensity"], r["updated"])
        for r in store.iter_runs()
    }


def _row(i: int, status: str = "success", **over):
    fields = {"text": f"q{i}", "start_s": 100.0 + i, "end_s": 101.0 + i, "propensity": 0.5}
    return served_row(i, status=status, **{**fields, **over})


def test_apply_feedback(table):
    url, store = table
    before = _snapshot(store)
    assert apply_feedback(store, "call-1", 1) == 1
    after = _snapshot(store)
    assert after["call-1"][0] == 1.0
    assert after["call-1"][1:4] == before["call-1"][1:4]  # energy, latency, propensity untouched
    assert {k: v for k, v in after.items() if k != "call-1"} == {k: v for k, v in before.items() if k != "call-1"}


@pytest.mark.parametrize(
    "call_id,score,status",
    [
        ("nope", 1, 404),
        ("call-0", 1.5, 422),
        ("call-0", -0.1, 422),
        ("call-0", float("nan"), 422),
        ("call-0", "abc", 422),
        ("call-0", "\u0660.\u0667", 422),  # Arabic-Indic digits: float() reads 0.7
        ("call-0", "1_0e-1", 422),  # an underscore: float() reads 1.0
        ("call-0", True, 422),
        ("call-0", 10**400, 422),  # too large for a float
        ("call-9", 1, 409),
        ("", 1, 400),
    ],
)
def test_rejected_feedback_writes_nothing(table, call_id, score, status):
    url, store = table
    before = _snapshot(store)
    with pytest.raises(FeedbackError) as e:
        apply_feedback(store, call_id, score)
    assert e.value.status == status and "\n" not in str(e.value)
    assert _snapshot(store) == before


def test_http_endpoint(sqlite_url, tmp_path):
    w = TableWriter(
        sqlite_url, EstimateMeter(), writer=WriterSettings(spool_dir=tmp_path / "spool"), privacy=PrivacySettings()
    )
    w.submit(_row(0))
    w.close()
    store = open_store(sqlite_url)
    with pytest.raises(ValueError, match="a bearer token is required"):
        feedback_app(store, "")
    with ThreadedApp(lambda: feedback_app(store, "tok")) as srv:
        url = f"{srv.url}/v1/feedback"
        auth = {"Authorization": "Bearer tok"}
        before = _snapshot(store)
        assert httpx.post(url, json={"call_id": "call-0", "score": 1}).status_code == 401
        assert (
            httpx.post(url, json={"call_id": "call-0", "score": 1}, headers={"Authorization": "Bearer x"}).status_code
            == 401
        )
        r = httpx.post(url, json={"call_id": "unknown", "score": 1}, headers=auth)
        assert r.status_code == 404 and "unknown call id" in r.json()["error"]
        r = httpx.post(url, json={"call_id": "call-0", "score": 2}, headers=auth)
        assert r.status_code == 422 and "out of range" in r.json()["error"]
        assert httpx.post(url, content=b"not json", headers=auth).status_code == 400
        for text in ("0.5", " 1 ", "\u0660.\u0667"):  # a JSON string is not a JSON number (it was stored as one)
            r = httpx.post(url, json={"call_id": "call-0", "score": text}, headers=auth)
            assert r.status_code == 422 and "not a JSON number" in r.json()["error"], r.text
        huge = b'{"call_id": "call-0", "score": 1' + b"0" * 400 + b"}"
        assert httpx.post(url, content=huge, headers=auth).status_code == 422
        assert (
            httpx.post(
                url, json={"call_id": "call-0", "score": 1}, headers={"Authorization": b"Bearer \xff"}
            ).status_code
            == 401
        )
        assert _snapshot(store) == before
        r = httpx.post(url, json={"call_id": "call-0", "score": 0.25}, headers=auth)
        assert r.status_code == 200 and r.json() == {"call_id": "call-0", "score": 0.25, "updated": 1}
    assert _snapshot(store)["call-0"][0] == 0.25
    store.close()


def test_a_caller_key_labels_only_the_calls_made_with_it(sqlite_url, tmp_path):
    """feedback.caller_keys: a LiteLLM virtual key is a bearer that labels the calls it made (rows record
    ``user_api_key_hash``, the key's SHA-256), never another key's, a master-key call or a row with no key; those
    answer the same 404 as an id never served. The operator's token still labels any call."""
    import hashlib

    h = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731  (LiteLLM's hash_token)
    w = TableWriter(
        sqlite_url, EstimateMeter(), writer=WriterSettings(spool_dir=tmp_path / "spool"), privacy=PrivacySettings()
    )
    w.submit(_row(0, key_hash=h("sk-alice")))
    w.submit(_row(1, key_hash=h("sk-bob")))
    w.submit(_row(2, key_hash="litellm-proxy-master-key"))  # what LiteLLM logs for the master key
    w.submit(_row(3))  # no key (the SDK Router, or a row from before the column)
    w.close()
    store = open_store(sqlite_url)
    assert {r["call_id"]: r["key_hash"] for r in store.iter_runs()}["call-0"] == h("sk-alice")
    with ThreadedApp(lambda: feedback_app(store, "tok", caller_keys=True)) as srv:
        url = f"{srv.url}/v1/feedback"

        def post(key, cid, score=1.0):
            return httpx.post(url, json={"call_id": cid, "score": score}, headers={"Authorization": f"Bearer {key}"})

        before = _snapshot(store)
        for key, cid in [("sk-bob", "call-0"), ("sk-alice", "call-1"), ("sk-alice", "call-2"), ("sk-alice", "call-3")]:
            r = post(key, cid)
            assert r.status_code == 404 and r.json()["error"] == f"unknown call id {cid!r} (no production row yet)"
        r = post("sk-alice", "never-served")
        assert r.status_code == 404 and r.json()["error"] == "unknown call id 'never-served' (no production row yet)"
        assert httpx.post(url, json={"call_id": "call-0", "score": 1}).status_code == 401  # no bearer
        assert post("-", "call-0").status_code == 404  # any other bearer is a key that owns nothing
        assert _snapshot(store) == before
        assert post("sk-alice", "call-0").json() == {"call_id": "call-0", "score": 1.0, "updated": 1}
        assert post("sk-bob", "call-1", 0.0).json()["updated"] == 1
        assert post("tok", "call-2", 0.5).json()["updated"] == 1 and post("tok", "call-0", 0.0).json()["updated"] == 1
    snap = _snapshot(store)
    assert [snap[f"call-{i}"][0] for i in range(4)] == [0.0, 0.0, 0.5, None]
    with ThreadedApp(lambda: feedback_app(store, "tok")) as srv:  # caller keys off (the default): a key is a 401
        r = httpx.post(
            f"{srv.url}/v1/feedback",
            json={"call_id": "call-0", "score": 1},
            headers={"Authorization": "Bearer sk-alice"},
        )
        assert r.status_code == 401
    store.close()


def test_cli(sqlite_url, tmp_path):
    w = TableWriter(
        sqlite_url, EstimateMeter(), writer=WriterSettings(spool_dir=tmp_path / "spool"), privacy=PrivacySettings()
    )
    w.submit(_row(0))
    w.close()
    r = subprocess.run(
        [EXE, "feedback", "set", "call-0", "0", "--db", sqlite_url], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert "scored 1 run(s) of call call-0 = 0" in r.stdout
    r = subprocess.run(
        [EXE, "feedback", "set", "call-0", "7", "--db", sqlite_url], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "score '7' is out of range [0, 1]" in r.stderr
    env = {k: v for k, v in os.environ.items() if "FEEDBACK" not in k}
    r = subprocess.run(
        [EXE, "feedback", "serve", "--db", sqlite_url], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 2 and "a bearer token is required" in r.stderr
    store = open_store(sqlite_url)
    assert _snapshot(store)["call-0"][0] == 0.0
    store.close()


def test_another_keys_row_under_a_call_id_never_joins_that_call(sqlite_url, tmp_path):
    """A call belongs to the key that made it: a row of another key under the same call id and text (its failed
    retry, another candidate's attempt) is stored as another request, so that key cannot label the call or take it
    over; the owner's own retry replaces its failed run and stays its own."""
    import hashlib

    h = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    w = TableWriter(
        sqlite_url, EstimateMeter(), writer=WriterSettings(spool_dir=tmp_path / "spool"), privacy=PrivacySettings()
    )
    w.submit(_row(0, status="failure", key_hash=h("sk-victim")))
    w.submit(_row(0, key_hash=h("sk-attacker"), end_s=105.0))  # the same call id and text, a success
    w.submit(_row(0, candidate="zero-one-ai/Yi-34B-Chat", key_hash=h("sk-attacker"), end_s=106.0))
    w.submit(_row(1, status="failure", key_hash=h("sk-victim")))
    w.submit(_row(1, key_hash=h("sk-victim"), end_s=107.0))  # the owner's retry
    w.close()
    store = open_store(sqlite_url)
    rows = [(r["call_id"], r["candidate"], r["status"], r["key_hash"]) for r in store.iter_runs()]
    mine = [r for r in rows if r[0] in ("call-0", "call-1")]
    assert mine == [
        ("call-0", "mistralai/mistral-7b-chat", "failure", h("sk-victim")),
        ("call-1", "mistralai/mistral-7b-chat", "success", h("sk-victim")),
    ], rows
    assert sum(r[0].startswith("dup-") and r[3] == h("sk-attacker") for r in rows) == 2
    with pytest.raises(FeedbackError) as e:
        apply_feedback(store, "call-0", 1.0, owner=h("sk-attacker"))
    assert e.value.status == 404
    assert apply_feedback(store, "call-1", 1.0, owner=h("sk-victim")) == 1
    store.close()


@pytest.mark.parametrize(
    "header,ok,owner",
    [
        (b"Bearer tok", True, None),
        (b"bearer tok", True, None),  # the scheme is case-insensitive (RFC 9110)
        (b"BEARER  tok ", True, None),
        (b"Bearer sk-a", True, "sha"),
        (b"Basic tok", False, None),
        (b"Bearer ", False, None),
        (b"tok", False, None),
        (b"Bearer " + b"k" * 5000, False, None),
    ],
)
def test_bearer_parsing(header, ok, owner):
    import hashlib

    from litellm_energy_router.feedback import bearer_owner

    got = bearer_owner(header, b"tok", True)
    assert got == (ok, hashlib.sha256(b"sk-a").hexdigest() if owner == "sha" else owner)
    assert bearer_owner(header, b"tok", False) == ((ok and owner is None), None)


def test_a_production_row_arriving_after_its_shadow_tournament_can_be_labelled(tmp_path):
    """A shadow tournament ran a queued entry before its production row reached the table (spooled through an outage
    over an hour) and wrote the query itself; the production row then met a query with no owner and was moved to a
    dup- id: no label could reach it (404 for the operator and the owner) and training saw one request as two."""
    import hashlib
    import time

    from litellm_energy_router.profiling.shadow_tournament import ShadowEntry, shadow_jobs

    from litellm_energy_router.table import Run
    from litellm_energy_router.table.rows import Candidate

    url = f"sqlite:///{tmp_path / 't.db'}"
    priv = PrivacySettings(salt="pepper")
    store = open_store(url)
    start = time.time() - 7200.0
    key = hashlib.sha256(b"sk-tenant").hexdigest()
    entry = ShadowEntry(query_id="prod-call-7", task="production", text="question 7", call_id="call-7", created=start)
    (job,) = shadow_jobs([entry], store, priv, now=time.time())
    cands = ("mistralai/mistral-7b-chat", "zero-one-ai/Yi-34B-Chat")
    shadow = [
        Run(query_id="prod-call-7", candidate=c, source="shadow", score=1.0, energy_j=5.0, status="success")
        for c in cands
    ]
    store.write(queries=[job.query], runs=shadow, candidates=[Candidate(name=c) for c in cands])
    w = TableWriter(url, EstimateMeter(), writer=WriterSettings(spool_dir=tmp_path / "spool"), privacy=priv)
    w.submit(served_row(7, text="question 7", start_s=start, end_s=start + 1, propensity=0.9, key_hash=key))
    w.close()
    runs = list(store.iter_runs())
    assert {r["query_id"] for r in runs} == {"prod-call-7"}, runs
    assert apply_feedback(store, "call-7", 0.0, owner=key) == 1
    store.close()
