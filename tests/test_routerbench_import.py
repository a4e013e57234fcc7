from __future__ import annotations

import csv
import gzip

import pytest
from litellm_energy_router.profiling.routerbench import (
    OPEN_MODELS,
    ImportFormatError,
    bundled_files,
    import_routerbench,
)

from litellm_energy_router.energy import load_profile
from litellm_energy_router.table import open_store

# Per-model accuracy on the development split, as published in shared/data/README.md (NaN skipped).
README_ACCURACY = {
    ("arc-challenge", "WizardLM/WizardLM-13B-V1.2"): 0.663,
    ("arc-challenge", "meta/code-llama-instruct-34b-chat"): 0.661,
    ("arc-challenge", "meta/llama-2-70b-chat"): 0.797,
    ("arc-challenge", "mistralai/mistral-7b-chat"): 0.670,
    ("arc-challenge", "mistralai/mixtral-8x7b-chat"): 0.851,
    ("arc-challenge", "zero-one-ai/Yi-34B-Chat"): 0.897,
    ("mbpp", "WizardLM/WizardLM-13B-V1.2"): 0.361,
    ("mbpp", "meta/code-llama-instruct-34b-chat"): 0.518,
    ("mbpp", "meta/llama-2-70b-chat"): 0.311,
    ("mbpp", "mistralai/mistral-7b-chat"): 0.328,
    ("mbpp", "mistralai/mixtral-8x7b-chat"): 0.542,
    ("mbpp", "zero-one-ai/Yi-34B-Chat"): 0.375,
    ("winogrande", "WizardLM/WizardLM-13B-V1.2"): 0.529,
    ("winogrande", "meta/code-llama-instruct-34b-chat"): 0.582,
    ("winogrande", "meta/llama-2-70b-chat"): 0.505,
    ("winogrande", "mistralai/mistral-7b-chat"): 0.563,
    ("winogrande", "mistralai/mixtral-8x7b-chat"): 0.676,
    ("winogrande", "zero-one-ai/Yi-34B-Chat"): 0.759,
}
# RouterBench's cost-derived token count rule (shared/data/README.md), USD per 1M tokens.
PRICE = {"mistralai/mistral-7b-chat": 0.2, "meta/llama-2-70b-chat": 0.9, "WizardLM/WizardLM-13B-V1.2": 0.3}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('rb') / 't.db'}"
    store = open_store(url)
    summary = import_routerbench(store, bundled_files(), load_profile())
    yield store, summary
    store.close()


def test_counts_and_skips(imported):
    store, s = imported
    assert s.queries == 2217 and s.runs == 2217 * 6
    assert s.skipped_queries == 8 and s.skipped_pairs == 8 * 6
    assert store.count_runs() == 2217 * 6
    assert {c.name for c in store.candidates()} == set(OPEN_MODELS)


def test_accuracy_matches_published_table(imported):
    store, _ = imported
    got = {(s.task, s.candidate): s.accuracy for s in store.stats(by_task=True)}
    assert set(got) == set(README_ACCURACY)
    for key, acc in README_ACCURACY.items():
        assert round(got[key], 3) == acc, key


def test_energy_is_an_estimate_consistent_with_cost(imported):
    store, _ = imported
    profile = load_profile()
    rows = list(store.iter_runs())
    assert {r["energy_method"] for r in rows} == {"estimate"} and {r["source"] for r in rows} == {"import"}
    # token counts agree with RouterBench's own cost column: cost = price * (prompt + output) tokens
    raw = {}
    with gzip.open(bundled_files()[0], "rt", encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            raw[f"routerbench:{row['eval_name']}:{row['']}"] = row
    checked = 0
    for r in rows:
        if r["query_id"] in raw and r["candidate"] in PRICE:
            total = float(raw[r["query_id"]][f"{r['candidate']}|total_cost"]) / (PRICE[r["candidate"]] * 1e-6)
            assert r["prompt_tokens"] + r["completion_tokens"] == round(total)
            e = profile.models[r["candidate"]]
            assert r["energy_j"] == pytest.approx(
                r["prompt_tokens"] * e.j_per_prompt_token + r["completion_tokens"] * e.j_per_output_token
            )
            checked += 1
    assert checked > 1000


def test_reimport_adds_nothing(imported):
    store, _ = imported
    import_routerbench(store, bundled_files()[-1:], load_profile())
    assert store.count_runs() == 2217 * 6


def _write_csv(path, rows, header):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def _small_file(tmp_path, n=5):
    with gzip.open(bundled_files()[-1], "rt", encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        rows = [next(reader) for _ in range(n)]
    return header, rows


@pytest.mark.parametrize("damage", ["missing_column", "broken_literal", "bad_score"])
def test_malformed_file_imports_nothing(tmp_path, sqlite_url, damage):
    store = open_store(sqlite_url)
    header, rows = _small_file(tmp_path)
    good = tmp_path / "good.csv"
    _write_csv(good, rows[:2], header)
    import_routerbench(store, [good], load_profile())
    before = store.count_runs()
    assert before == 12
    bad_rows = [list(r) for r in rows[2:]]
    bad_header = list(header)
    if damage == "missing_column":
        i = bad_header.index("mistralai/mistral-7b-chat")
        bad_header.pop(i)
        bad_rows = [r[:i] + r[i + 1 :] for r in bad_rows]
        expect = "missing column 'mistralai/mistral-7b-chat'"
    elif damage == "broken_literal":
        bad_rows[1][header.index("prompt")] = "['unterminated"
        expect = ":3: column 'prompt': not a Python list literal"
    else:
        bad_rows[2][header.index("zero-one-ai/Yi-34B-Chat")] = "yes"
        expect = ":4: column 'zero-one-ai/Yi-34B-Chat': correctness 'yes' is not a number"
    bad = tmp_path / "bad.csv"
    _write_csv(bad, bad_rows, bad_header)
    with pytest.raises(ImportFormatError) as ei:
        import_routerbench(store, [good, bad], load_profile())
    assert str(bad) in str(ei.value) and expect in str(ei.value) and "\n" not in str(ei.value)
    assert store.count_runs() == before
    store.close()


def test_unknown_model_names_profile(tmp_path, sqlite_url):
    from litellm_energy_router.energy import ProfileError

    store = open_store(sqlite_url)
    with pytest.raises(ProfileError, match="no entry for candidate 'gpt-4-1106-preview'"):
        import_routerbench(store, bundled_files(), load_profile(), ["gpt-4-1106-preview"])
    assert store.count_runs() == 0


def test_keep_filter_holds_queries_back(tmp_path):
    from litellm_energy_router.profiling.routerbench import iter_records

    files = [f for f in bundled_files() if "winogra" in f.name]
    ids = [r.query_id for r in iter_records(files)]
    held = set(ids[::5])
    store = open_store(f"sqlite:///{tmp_path / 'k.db'}")
    s = import_routerbench(store, files, load_profile(), keep=lambda q: q not in held)
    got = {r["query_id"] for r in store.iter_runs()}
    store.close()
    assert s.held_back == len(held) and s.queries == len(ids) - len(held)
    assert got == set(ids) - held
    assert f"held back {len(held)} queries" in s.line("x")
