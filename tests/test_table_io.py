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
