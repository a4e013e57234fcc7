"""``energy-router route --input``: plain-text prompts, chat ``messages`` JSON, CSV or JSONL, and
RouterBench's list-literal CSV; a bad file is one line naming it."""

from __future__ import annotations

import csv
import json

import pytest
from router_fixtures import planted_rows

from litellm_energy_router.cli import main
from litellm_energy_router.cli.route_input import RouteInputError, read_route_input
from litellm_energy_router.table import open_store

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


def test_every_format_gives_the_same_prompt(tmp_path):
    (tmp_path / "p.txt").write_text("What is 2+2?\n\nName a prime.\n")
    (tmp_path / "p.jsonl").write_text(
        json.dumps({"prompt": "What is 2+2?", "eval_name": "math", "id": "a"})
        + "\n"
        + json.dumps({"messages": MSGS})
        + "\n"
        + json.dumps(MSGS)
        + "\n"
    )
    (tmp_path / "m.json").write_text(json.dumps(MSGS))
    with open(tmp_path / "rb.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(
            [
                ["", "sample_id", "prompt", "eval_name"],
                [7, "s", "['What is 2+2?']", "math"],
                [8, "s", "[not a literal] What is 2+2?", "math"],
            ]
        )
    with open(tmp_path / "chat.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([["id", "messages"], ["c1", json.dumps(MSGS)]])
    assert read_route_input(tmp_path / "p.txt") == [("0", None, "What is 2+2?"), ("1", None, "Name a prime.")]
    rows = read_route_input(tmp_path / "p.jsonl")
    assert rows[0] == ("a", "math", "What is 2+2?") and rows[1][2] == rows[2][2] and "What is 2+2?" in rows[1][2]
    assert read_route_input(tmp_path / "m.json")[0][2] == rows[1][2]  # the text a served request routes on
    assert read_route_input(tmp_path / "rb.csv") == [
        ("7", "math", "What is 2+2?"),
        ("8", "math", "[not a literal] What is 2+2?"),
    ]
    assert read_route_input(tmp_path / "chat.csv") == [("c1", None, rows[1][2])]


@pytest.mark.parametrize(
    "name, text, named",
    [
        ("bad.jsonl", '{"prompt": "ok"}\n{"prompt": \n', "bad.jsonl:2: not valid JSON"),
        ("bad.jsonl", '{"text": "x"}\n', "bad.jsonl:1: needs 'prompt'"),
        ("bad.csv", "a,b\n1,2\n", "bad.csv: missing column 'prompt'"),
        ("bad.csv", "prompt,eval_name\nx\n", "bad.csv:2: 1 fields"),
        ("empty.txt", "\n\n", "empty.txt: no prompts"),
        ("list.jsonl", '{"prompt": "hi", "eval_name": ["a"]}\n', "list.jsonl:1: field 'eval_name'"),  # a traceback
    ],
)
def test_bad_files_are_one_line(tmp_path, name, text, named):
    (tmp_path / name).write_text(text)
    with pytest.raises(RouteInputError) as ei:
        read_route_input(tmp_path / name)
    assert named in str(ei.value) and "\n" not in str(ei.value)


def test_route_serves_plain_text_and_chat_json(tmp_path, capsys):
    store = open_store(f"sqlite:///{tmp_path / 't.db'}")
    c, q, runs = planted_rows(30)
    store.write(q, runs, candidates=c)
    store.close()
    with pytest.raises(SystemExit) as ei:
        main(
            ["train", "--db", f"sqlite:///{tmp_path / 't.db'}", "--out", str(tmp_path / "ck"), "--scorer", "task_prior"]
        )
    assert ei.value.code == 0
    (tmp_path / "p.txt").write_text("Tell me about glass\n")
    (tmp_path / "m.json").write_text(json.dumps([{"role": "user", "content": "Tell me about glass"}]))
    for inp in ("p.txt", "m.json"):
        with pytest.raises(SystemExit) as ei:
            main(
                [
                    "route",
                    "--checkpoint",
                    str(tmp_path / "ck"),
                    "--input",
                    str(tmp_path / inp),
                    "--output",
                    str(tmp_path / "d.jsonl"),
                ]
            )
        assert ei.value.code == 0, capsys.readouterr().err
        lines = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
        assert len(lines) == 1 and lines[0]["model"] in lines[0]["scores"]
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as ei:
        main(
            [
                "route",
                "--checkpoint",
                str(tmp_path / "ck"),
                "--input",
                str(tmp_path / "bad.jsonl"),
                "--output",
                str(tmp_path / "d.jsonl"),
            ]
        )
    err = capsys.readouterr().err.strip()
    assert ei.value.code == 2 and len(err.splitlines()) == 1 and "bad.jsonl:1: not valid JSON" in err


@pytest.mark.parametrize(
    "name, text",
    [
        ("p.csv", "id,prompt,eval_name\r\nq7,What is 2+2?,math\r\n"),
        ("p.jsonl", '{"prompt": "What is 2+2?", "eval_name": "math", "id": "q7"}\n'),
        ("p.json", '[{"prompt": "What is 2+2?", "eval_name": "math", "id": "q7"}]'),
        ("p.txt", "What is 2+2?\n"),
    ],
)
def test_a_file_with_a_byte_order_mark_reads_as_without(tmp_path, name, text):
    """A spreadsheet's or an editor's BOM: its CSV header's first column was not found (or the ids replaced by line
    numbers), JSON did not parse, a text's first prompt began with U+FEFF."""
    (tmp_path / name).write_bytes(text.encode("utf-8-sig"))
    (tmp_path / ("plain-" + name)).write_bytes(text.encode("utf-8"))
    assert read_route_input(tmp_path / name) == read_route_input(tmp_path / ("plain-" + name))


def test_route_output_that_fails_half_way_leaves_the_earlier_file(tmp_path, monkeypatch):
    """``route --output`` wrote in place: a run failing after its first operating point left a truncated file where
    the earlier decisions were. Written beside it and moved in at the end."""
    import numpy as np

    from litellm_energy_router.cli.router_cmds import _write_decisions
    from litellm_energy_router.knob import Knob
    from litellm_energy_router.router import decide as decide_mod

    out = tmp_path / "decisions.jsonl"
    out.write_text('{"earlier": true}\n')
    rows, P, E = [("0", None, "q")], np.array([[0.5, 0.9]]), np.array([[1.0, 9.0]])
    calls = []

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("the second operating point")
        return np.array([0])

    monkeypatch.setattr(decide_mod, "decide", failing)
    points = [("lambda", 0.0, Knob(lambda_=0.0)), ("lambda", 1.0, Knob(lambda_=1.0))]
    with pytest.raises(MemoryError):
        _write_decisions(out, rows, points, P, E, ["a", "b"])
    assert out.read_text() == '{"earlier": true}\n' and [p.name for p in tmp_path.iterdir()] == ["decisions.jsonl"]
    _write_decisions(out, rows, points[:1], P, E, ["a", "b"])
    assert '"model": "a"' in out.read_text()
