# Two entry points: `make demo` (the main job, offline, embedded defaults) and `make test`.
# Both create .venv on first use: CPU torch first (the 2.13.0 file on disk), then the package.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo demo-quick test postgres bench

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev,postgres,proxy,train]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/energy-router demo

# The reduced demo CI runs (tiny training, 100 served queries), in a throw-away directory.
demo-quick: install
	rm -rf .ci-demo && $(BIN)/energy-router demo --quick --db sqlite:///.ci-demo/demo.db --workdir .ci-demo/work

# Start the local PostgreSQL cluster when it is not running (Debian's pg_ctlcluster).
postgres:
	@pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null || \
	  (command -v pg_ctlcluster >/dev/null && pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start) || \
	  echo "PostgreSQL not started: its tests skip (or fail under CI=true)"

test: install postgres
	$(BIN)/python -m pytest -q -ra

bench: install postgres
	$(BIN)/python benchmarks/bench_table.py
