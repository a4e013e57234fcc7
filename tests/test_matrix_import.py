"""`energy-router table import-matrix`: the documented JSONL/CSV forms and LLMRouter's JSON into the table;
one-line errors (exit 2) for an unknown model and a bad score, nothing written then."""

from __future__ import annotations

import csv
import json

import pytest
from litellm_energy_router.training.data import load_matrix

from litellm_energy_router.cli import main
from litellm_energy_router.energy.profile import load_profile
from litellm_energy_router.table import open_store

A, B = "mistralai/mistral-7b-chat", "meta/llama-2-70b-chat"  # candidates of the bundled profile


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def _long_rows() -> list[dict]:
    return [
        {
            "query_id": "q1",
            "task": "trivia",
            "query": "Capital of France?",
            "model": "small",
            "score": 1,
            "output_tokens": 3,
        },
        {
            "query_id": "q1",
            "task": "trivia",
            "query": "Capital of France?",
            "model": "big",
            "score": 1,
            "output_tokens": 4,
        },
        {"query_id": "q2", "task": "code", "query": "Write fizzbuzz in Python.", "model": "small", "score": 0},
        {"query_id": "q2", "task": "code", "query": "Write fizzbuzz in Python.", "model": "big", "score": 0.5},
    ]


def _write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENERGY_ROUTER_CONFIG", raising=False)


def test_jsonl_long_form_imports_rows_with_estimated_energy(tmp_path, capsys):
    f, db = tmp_path / "m.jsonl", f"sqlite:///{tmp_path / 't.db'}"
    _write_jsonl(f, _long_rows())
    code, out, err = _run(capsys, ["table", "import-matrix", str(f), "--db", db, "--map", f"small={A},big={B}"])
    assert code == 0, err
    assert "imported 2 queries, 4 runs (2 candidates)" in out and "2 runs priced with the chat-length prior" in out
    store = open_store(db)
    runs = {(r["query_id"], r["candidate"]): r for r in store.iter_runs()}
    m = load_matrix(store)
    store.close()
    prof = load_profile()
    r = runs[("q1", B)]
    assert (
        r["score"] == 1 and r["completion_tokens"] == 4 and r["energy_method"] == "estimate" and r["source"] == "import"
    )
    assert r["energy_j"] == pytest.approx(prof.estimate_j(B, r["prompt_tokens"], 4))
    r = runs[("q2", A)]  # no output tokens: priced with the candidate's chat-length prior, tokens left unknown
    prior = prof.models[A].reference["avg_output_tokens"]
    assert r["completion_tokens"] is None and r["energy_j"] == pytest.approx(
        prof.estimate_j(A, r["prompt_tokens"], prior)
    )
    assert runs[("q2", B)]["score"] == 0.5
    assert sorted(m.task_names()) == ["code", "trivia"] and m.n == 2 and m.K == 2


def test_csv_and_wide_jsonl_give_the_same_table(tmp_path, capsys):
    rows = _long_rows()
    with open(tmp_path / "m.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["query_id", "task", "query", "model", "score", "output_tokens"])
        w.writeheader()
        w.writerows(rows)
    wide = [
        {
            "query_id": q,
            "task": rs[0]["task"],
            "query": rs[0]["query"],
            "scores": {r["model"]: r["score"] for r in rs},
            "output_tokens": {r["model"]: r["output_tokens"] for r in rs if "output_tokens" in r},
        }
        for q in ("q1", "q2")
        for rs in [[r for r in rows if r["query_id"] == q]]
    ]
    _write_jsonl(tmp_path / "w.jsonl", wide)
    got = []
    for name in ("m.csv", "w.jsonl"):
        db = f"sqlite:///{tmp_path / (name + '.db')}"
        code, _, err = _run(
            capsys,
            ["table", "import-matrix", str(tmp_path / name), "--db", db, "--map", f"small={A}", "--map", f"big={B}"],
        )
        assert code == 0, err
        store = open_store(db)
        got.append(
            sorted(
                (r["query_id"], r["candidate"], r["score"], r["completion_tokens"], round(r["energy_j"], 6))
                for r in store.iter_runs()
            )
        )
        store.close()
    assert got[0] == got[1] and len(got[0]) == 4


def test_llmrouter_json_joins_tasks(tmp_path, capsys):
    d = tmp_path / "llmrouter"
    d.mkdir()
    (d / "train.json").write_text(
        json.dumps(
            [
                {"question": "What is 2+2?", "scores": {"s": 1.0, "b": 0.0}, "cluster_id": 0},
                {"question": "Name a prime.", "scores": {"s": 0.0, "b": 1.0}, "cluster_id": 1},
            ],
            indent=1,
        )
    )
    _write_jsonl(
        d / "default_query_train.jsonl",
        [{"task_name": "gsm8k", "query": "What is 2+2?"}, {"task_name": "math", "query": "Name a prime."}],
    )
    db = f"sqlite:///{tmp_path / 't.db'}"
    code, _, err = _run(capsys, ["table", "import-matrix", str(d / "train.json"), "--db", db, "--map", f"s={A},b={B}"])
    assert code == 0, err
    store = open_store(db)
    m = load_matrix(store, candidates=[A, B])
    store.close()
    by_task = dict(zip(m.tasks.tolist(), m.Y.tolist()))
    assert by_task == {"gsm8k": [1.0, 0.0], "math": [0.0, 1.0]}


@pytest.mark.parametrize(
    "at, bad, named",
    [
        (3, {"model": "huge"}, "model 'huge' has no candidate"),
        (3, {"score": 1.5}, "field 'score' = 1.5"),
        (3, {"score": "yes"}, "field 'score' = 'yes'"),
        (3, {"output_tokens": -3}, "field 'output_tokens' = -3"),
        # an infinite count was a traceback; one query id with two texts or tasks was merged (the second model's score
        # stored as its answer to the first text)
        (1, {"output_tokens": float("inf")}, "field 'output_tokens' = inf: not a non-negative integer"),
        (1, {"query": "Capital of Peru?"}, "query_id 'q1' has another query text than at"),
        (1, {"task": "geo"}, "query_id 'q1' has another task than at"),
    ],
)
def test_bad_line_is_one_line_and_writes_nothing(tmp_path, capsys, at, bad, named):
    rows = _long_rows()
    rows[at] = {**rows[at], **bad}
    f, db = tmp_path / "m.jsonl", tmp_path / "t.db"
    _write_jsonl(f, rows)
    code, _, err = _run(
        capsys, ["table", "import-matrix", str(f), "--db", f"sqlite:///{db}", "--map", f"small={A},big={B}"]
    )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"{f}:{at + 1}: " in lines[0] and named in lines[0], lines[0]
    store = open_store(f"sqlite:///{db}")
    assert store.count_runs() == 0  # validated before anything was written
    store.close()


def test_model_without_profile_entry_is_one_line(tmp_path, capsys):
    f = tmp_path / "m.jsonl"
    _write_jsonl(f, _long_rows())
    code, _, err = _run(capsys, ["table", "import-matrix", str(f), "--db", f"sqlite:///{tmp_path / 't.db'}"])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "no entry for candidate" in lines[0], err


def test_a_query_id_the_table_holds_for_another_query_is_refused(tmp_path, capsys):
    """A second matrix reusing a query id for another question: exit 2 naming its file and line, the stored query
    and its runs untouched; the same matrix imported again is idempotent."""
    f, g, db = tmp_path / "m.jsonl", tmp_path / "other.jsonl", f"sqlite:///{tmp_path / 't.db'}"
    _write_jsonl(f, _long_rows())
    _write_jsonl(g, [{**_long_rows()[0], "query": "Capital of Peru?"}])
    args = ["--db", db, "--map", f"small={A},big={B}"]
    assert _run(capsys, ["table", "import-matrix", str(f), *args])[0] == 0
    code, _, err = _run(capsys, ["table", "import-matrix", str(g), *args])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{g}:1:" in err and "id 'q1'" in err and "the table holds another query" in err
    assert _run(capsys, ["table", "import-matrix", str(f), *args])[0] == 0
    store = open_store(db)
    texts = {r["query_id"]: r["text"] for r in store.iter_runs()}
    store.close()
    assert texts == {"q1": "Capital of France?", "q2": "Write fizzbuzz in Python."}


def test_a_spreadsheet_csv_with_a_byte_order_mark_keeps_its_first_column(tmp_path, capsys):
    """Excel's "CSV UTF-8" begins with a BOM: the first column was read as '\\ufeffquery_id' and every query id silently
    replaced by the text's hash."""
    f, db = tmp_path / "m.csv", f"sqlite:///{tmp_path / 't.db'}"
    rows = _long_rows()
    with open(f, "w", newline="", encoding="utf-8-sig") as fh:
        w = csv.DictWriter(fh, fieldnames=["query_id", "task", "query", "model", "score", "output_tokens"])
        w.writeheader()
        w.writerows(rows)
    code, _, err = _run(capsys, ["table", "import-matrix", str(f), "--db", db, "--map", f"small={A},big={B}"])
    assert code == 0, err
    store = open_store(db)
    assert {r["query_id"] for r in store.iter_runs()} == {"q1", "q2"}
    store.close()
