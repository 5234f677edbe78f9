PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# DBOS, for `make bench-peers` only, in a virtual environment of its own
PEERS_VENV   ?= .venv-peers
DBOS_VERSION ?= 3.4.0
# The suite runs in six processes on two cores: most of its time is spent waiting on real
# workers. The long fault runs (the `long` marker, tests/conftest.py) run in three, their
# timing being part of what they test.
PYTEST_ARGS ?= -n 6 --dist load
LONG_PYTEST_ARGS ?= -n 3 --dist load

.PHONY: install test test-long test-compose unit lint format demo docs bench bench-quick bench-peers clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,evals,embedded,docs,sqlalchemy,examples,console,otel,metrics,encryption,mcp]'
	touch $@

# everything but the long fault runs (under 4 minutes here)
test: install
	$(BIN)/pytest $(PYTEST_ARGS) -m "not long and not compose"

# the long fault runs: the crash matrices, chaos, twenty killed children, Postgres outages,
# the evals end to end (a few minutes; CI runs them after make test)
test-long: install
	$(BIN)/pytest $(LONG_PYTEST_ARGS) -m "long and not compose"

# compose.yaml for real: needs Docker with Compose v2 (../shared/containers/engine.sh up)
test-compose: install
	$(BIN)/pytest tests/compose -m compose -p no:xdist

unit: install
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

demo: install
	$(BIN)/durable-agent demo

# the documentation site, into site/; --strict: a broken link or a missing reference fails
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# the figures of the docs' benchmarks page (docs/bench-results.json, committed)
bench: install
	$(BIN)/python -m bench --json docs/bench-results.json

# one round of each benchmark, tables up to 100,000 rows: a few minutes, for CI
bench-quick: install
	$(BIN)/python -m bench --quick --json bench-results.json

# DBOS side by side (per step, replay of 1,001 recorded steps), about a minute; DBOS is
# installed from PyPI into $(PEERS_VENV), never into $(VENV)
bench-peers: $(PEERS_VENV)/.installed-dbos-$(DBOS_VERSION)
	$(PEERS_VENV)/bin/python -m bench.peers --json bench-peers-results.json

$(PEERS_VENV)/.installed-dbos-$(DBOS_VERSION): pyproject.toml
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/pip install --quiet -e . dbos==$(DBOS_VERSION)
	touch $@

clean:
	rm -rf $(VENV) $(PEERS_VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info site
