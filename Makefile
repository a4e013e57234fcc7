# Two entry points: `make demo` (the main job, offline, embedded defaults) and `make test`.
# Both create .venv on first use: CPU torch first (the 2.13.0 file on disk), then the package.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo demo-full demo-quick test test-litellm-oldest postgres bench

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev,postgres,proxy,train]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/energy-router demo

# The same loop with the long training (the default TrainConfig, 4 SFT epochs, retrain from scratch): docs/demo.md.
demo-full: install
	$(BIN)/energy-router demo --full-training

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

# Formatting and lint as configured in pyproject.toml ([tool.ruff]); .ci/run runs it.
lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

# The oldest end of the supported LiteLLM range (pyproject's lower bound; docs/compatibility.md): `make test`
# covers the newest, this swaps the oldest LiteLLM into the same .venv, runs the tests marked
# litellm_integration, and puts every package back as it was (versions, and nothing left over), pass or fail.
# LITELLM_OLDEST_WITH: what that release's proxy needs that our [proxy] extra leaves unpinned (its MCP
# client imports mcp 1.x). pip is run as `python -m pip`: a copied venv's pip script may name another one.
LITELLM_OLDEST := 1.80.0
LITELLM_OLDEST_WITH := "mcp<2"
NEWEST_FREEZE := $(VENV)/.litellm-newest-freeze.txt
test-litellm-oldest: install
	$(BIN)/python -m pip freeze --exclude-editable > $(NEWEST_FREEZE)
	rc=0; \
	$(BIN)/python -m pip install --quiet "litellm==$(LITELLM_OLDEST)" $(LITELLM_OLDEST_WITH) -e ".[dev,postgres,proxy,train]" \
	  && $(BIN)/python -c 'import importlib.metadata as m; v = m.version("litellm"); print("litellm", v); assert v == "$(LITELLM_OLDEST)"' \
	  && $(BIN)/python -m pytest -q -ra -m litellm_integration || rc=$$?; \
	echo "restoring the newest LiteLLM environment"; \
	$(BIN)/python -m pip install --quiet -r $(NEWEST_FREEZE) || rc=1; \
	extra=$$($(BIN)/python -m pip freeze --exclude-editable | grep -vxFf $(NEWEST_FREEZE) | cut -d= -f1); \
	if [ -n "$$extra" ]; then $(BIN)/python -m pip uninstall --quiet -y $$extra || rc=1; fi; \
	$(BIN)/python -m pip freeze --exclude-editable | cmp -s - $(NEWEST_FREEZE) || { echo "environment not restored"; rc=1; }; \
	exit $$rc

bench: install postgres
	$(BIN)/python benchmarks/bench_table.py
