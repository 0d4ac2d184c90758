# `make run` and `make test` work on a fresh machine: they create .venv and install everything.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA_DIR ?= .joch
PORT ?= 8080
export JOCH_TEST_POSTGRES ?= postgresql://postgres@127.0.0.1:5432/test

.PHONY: run test lint typecheck unit postgres-up bench bench-runs bench-watch-memory clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/joch server --data-dir $(DATA_DIR) --port $(PORT) --apply examples/quickstart/

# Start the local PostgreSQL when it is installed but down (CI machines run it already).
postgres-up:
	@if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -q -h 127.0.0.1 -p 5432; then \
		if command -v pg_ctlcluster >/dev/null 2>&1; then \
			pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start || true; \
			for i in 1 2 3 4 5 6 7 8 9 10; do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done; \
		fi; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) postgres-up lint typecheck
	$(BIN)/pytest -q

bench: $(STAMP) postgres-up
	$(BIN)/python bench/store_bench.py

bench-runs: $(STAMP)
	$(BIN)/python bench/run_bench.py

bench-watch-memory: $(STAMP)
	$(BIN)/python bench/watch_memory.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache $(DATA_DIR)
