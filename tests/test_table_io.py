from __future__ import annotations

import csv
import re

import pytest
from litellm_energy_router.profiling.routerbench import bundled_files, import_routerbench

from litellm_energy_router.energy import load_profile
from litellm_energy_router.table import BadRowError, open_store
from litellm_energy_router.table.io import export_table, import_table

KEYS = (
    "query_id",
    "candidate",
    "source",
    "score",
    "energy_j",
    "prompt_tokens",
    "completion_tokens",
    "task",
    "text_hash",
    "model",
)


def _rows(store):
    return sorted(tuple(r[k] for k in KEYS) for r in store.iter_runs())


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_roundtrip_sqlite_to_postgres(tmp_path, sqlite_url, pg_url, fmt):
    src = open_store(sqlite_url)
    import_routerbench(src, bundled_files()[-1:], load_profile())  # winogrande: 887 x 6
    out = tmp_path / f"export.{fmt}"
    assert export_table(src, out) == 887 * 6
    dst = open_store(pg_url)
    assert import_table(dst, out) == 887 * 6
    assert _rows(dst) == _rows(src)
    import_table(dst, out)  # idempotent
    assert dst.count_runs() == 887 * 6
    src.close()
    dst.close()


def test_bad_value_names_line_and_field(tmp_path, sqlite_url):
    src = open_store(sqlite_url)
    import_routerbench(src, bundled_files()[-1:], load_profile())
    out = tmp_path / "e.csv"
    export_table(src, out)
    with open(out, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    rows[5][rows[0].index("energy_j")] = "-3"  # the 5th record (query texts hold newlines: not the 6th line)
    with open(out, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows)
    dst = open_store(f"sqlite:///{tmp_path / 'dst.db'}")
    with pytest.raises(BadRowError) as ei:
        import_table(dst, out)
    m = re.search(rf"^{re.escape(str(out))}:line (\d+): field 'energy_j' = '-3'", str(ei.value))
    assert m, str(ei.value)
    physical = out.read_text(encoding="utf-8").split("\n")[int(m.group(1)) - 1]  # the line the record starts on
    assert physical.startswith(rows[5][0]) and int(m.group(1)) > 6, physical[:80]
    assert dst.count_runs() == 0


def test_unknown_suffix(tmp_path, sqlite_url):
    with pytest.raises(ValueError, match="unknown format"):
        export_table(open_store(sqlite_url), tmp_path / "x.json")


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_every_run_field_survives_an_export_and_its_import(tmp_path, sqlite_url, pg_url, fmt):
    """An export holds the whole run, accounting and attribution included (context, key hash, site, CO2e, the
    decision-time estimates): imported elsewhere it is the same row, and imported over its own table it changes
    nothing (it wiped those columns). Written in batches: the export never holds the table."""
    from litellm_energy_router.table import Candidate, Query, Run

    full = dict(
        source="production",
        score=1.0,
        latency_s=1.5,
        ttft_s=0.2,
        prompt_tokens=10,
        completion_tokens=5,
        energy_j=12.5,
        avg_power_w=300.0,
        energy_method="nvml_counter",
        gpu="H100",
        propensity=0.9,
        status="success",
        grade_note="n",
        created=1000.0,
        router_version="v1",
        energy_estimate_j=11.0,
        energy_reference_j=40.0,
        co2e_g=0.002,
        site="north",
        context="ctx:0123456789abcdef|cl:3",
        key_hash="ab" * 32,
    )
    assert set(full) | {"query_id", "candidate", "call_id"} == set(Run.model_fields)  # a new field joins this test
    src = open_store(sqlite_url)
    qs = [
        Query(id=f"prod-c{i}", task="production", text=f"t{i}", text_hash=f"{i:064d}", source="production")
        for i in range(5)
    ]
    src.write(
        qs,
        [Run(query_id=q.id, candidate="m", call_id=f"c{i}", **full) for i, q in enumerate(qs)],
        candidates=[Candidate(name="m")],
    )
    runs = lambda s: sorted(  # noqa: E731
        tuple((k, r[k]) for k in sorted(Run.model_fields)) for r in s.iter_runs()
    )
    out = tmp_path / f"export.{fmt}"
    assert export_table(src, out, batch=2) == 5
    dst = open_store(pg_url)
    assert import_table(dst, out) == 5 and runs(dst) == runs(src)
    before = runs(src)
    import_table(src, out)
    assert runs(src) == before
    src.close()
    dst.close()


def test_an_unknown_column_is_refused_before_anything_is_written(tmp_path, sqlite_url):
    """A misspelt column (``scor``) would import every row without its label and overwrite the stored one: refused in
    one line naming it, the table untouched."""
    src = open_store(sqlite_url)
    import_routerbench(src, bundled_files()[-1:], load_profile())
    out = tmp_path / "export.csv"
    export_table(src, out)
    before = _rows(src)
    lines = out.read_text().splitlines(keepends=True)
    typo = tmp_path / "typo.csv"
    typo.write_text(lines[0].replace(",score,", ",scor,") + "".join(lines[1:]))
    with pytest.raises(BadRowError, match=r"typo.csv: unknown column 'scor'"):
        import_table(src, typo)
    assert _rows(src) == before
    src.close()


def test_an_earlier_export_imported_over_the_table_keeps_what_the_table_holds(tmp_path, sqlite_url):
    """An export made before a label arrived, and by a release without the newer columns (no ``key_hash``, no
    ``co2e_g``), imported over the table: its empty values and missing columns never erase a stored value (they
    wiped the label, the CO2e and the key's hash); a value it does hold is written."""
    from litellm_energy_router.table import Candidate, Query, Run

    store = open_store(sqlite_url)
    q = Query(id="q1", task="t", text="x", text_hash="1" * 64, source="production")
    run = dict(query_id="q1", candidate="m", source="production", call_id="c1", energy_j=5.0)
    store.write([q], [Run(**run)], candidates=[Candidate(name="m", params_b=7.0)])
    old = tmp_path / "old.csv"
    export_table(store, old)
    store.write([q], [Run(**run, score=1.0, co2e_g=0.5, key_hash="ab" * 32)])  # labelled and accounted since
    lines = old.read_text().splitlines()
    cols = lines[0].split(",")
    drop = [cols.index("key_hash"), cols.index("co2e_g")]
    keep = lambda line: ",".join(v for i, v in enumerate(next(csv.reader([line]))) if i not in drop)  # noqa: E731
    older = tmp_path / "older.csv"
    older.write_text("\n".join(keep(line).replace(",5.0,", ",6.0,") for line in lines) + "\n")
    assert import_table(store, older) == 1
    (r,) = store.iter_runs()
    assert (r["score"], r["co2e_g"], r["key_hash"], r["energy_j"], r["params_b"]) == (1.0, 0.5, "ab" * 32, 6.0, 7.0)
    store.close()


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_import_streams_in_batches_and_is_all_or_nothing(tmp_path, sqlite_url, fmt):
    """Written ``batch`` rows at a time in one transaction: a query id a later batch gives another text is refused,
    and the batches before it are not left behind."""
    src = open_store(sqlite_url)
    import_routerbench(src, bundled_files()[-1:], load_profile())
    out = tmp_path / f"e.{fmt}"
    export_table(src, out)
    dst = open_store(f"sqlite:///{tmp_path / 'dst.db'}")
    assert import_table(dst, out, batch=500) == 887 * 6 and _rows(dst) == _rows(src)
    if fmt == "csv":  # saved by a spreadsheet as "CSV UTF-8" (a BOM first): it said "missing column 'query_id'"
        bom = open_store(f"sqlite:///{tmp_path / 'bom.db'}")
        (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + out.read_bytes())
        assert import_table(bom, tmp_path / "bom.csv") == 887 * 6 and _rows(bom) == _rows(src)
        bom.close()
        with open(out, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        again = list(rows[1])  # the first row's query again at the end, in a later batch, with another text
        again[rows[0].index("text_hash")], again[rows[0].index("source")] = "f" * 64, "import"
        rows.append(again)
        with open(out, "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows(rows)
        empty = open_store(f"sqlite:///{tmp_path / 'empty.db'}")
        with pytest.raises(BadRowError, match="holds another query under this id"):
            import_table(empty, out, batch=500)
        assert empty.count_runs() == 0
        empty.close()
    src.close()
    dst.close()


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_an_export_that_fails_half_way_leaves_the_earlier_file(tmp_path, sqlite_url, fmt, monkeypatch):
    """The export wrote its target in place: one that failed (a lost connection, a full disk, Ctrl-C) half way left a
    truncated file where yesterday's whole export was. It writes beside it and moves it in at the end."""
    src = open_store(sqlite_url)
    import_routerbench(src, bundled_files()[-1:], load_profile())
    out = tmp_path / f"e.{fmt}"
    assert export_table(src, out) == 887 * 6
    before = out.read_bytes()
    rows = src.iter_runs

    def failing(*a, **k):
        for i, r in enumerate(rows(*a, **k)):
            if i == 3000:
                raise ConnectionError("server closed the connection")
            yield r

    monkeypatch.setattr(src, "iter_runs", failing)
    with pytest.raises(ConnectionError):
        export_table(src, out, batch=500)
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    src.close()
