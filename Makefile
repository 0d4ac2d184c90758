# `make run` and `make test` work on a fresh machine: they create .venv and install from the locks.
# requirements.lock pins what running needs; requirements-dev.lock adds the tests and linters.
# `make lock` regenerates both from pyproject.toml's ranges (the only step that picks new releases).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DATA_DIR ?= .joch
PORT ?= 8080
export JOCH_TEST_POSTGRES ?= postgresql://postgres@127.0.0.1:5432/test

.PHONY: run test lint typecheck venv venv-dev lock postgres-up sandbox-tools bench bench-runs bench-watch-memory \
	bench-policy bench-governance bench-http bench-start agent-clis browser-tools clean

venv:
	@scripts/venv $(PYTHON) $(VENV) requirements.lock

venv-dev:
	@scripts/venv $(PYTHON) $(VENV) requirements-dev.lock

# --apply-missing: create the quickstart objects that do not exist; edits to existing ones are kept.
run: venv
	$(BIN)/joch server --data-dir $(DATA_DIR) --port $(PORT) --apply-missing examples/quickstart/

# Start the local PostgreSQL when it is installed but down (CI machines run it already).
postgres-up:
	@if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -q -h 127.0.0.1 -p 5432; then \
		if command -v pg_ctlcluster >/dev/null 2>&1; then \
			pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start || true; \
			for i in 1 2 3 4 5 6 7 8 9 10; do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done; \
		fi; \
	fi

lint: venv-dev
	$(BIN)/ruff check src tests bench

typecheck: venv-dev
	$(BIN)/mypy

# bubblewrap sandboxes agents (joch server --sandbox); install it where apt is usable as root.
sandbox-tools:
	@command -v bwrap >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get install -y -q bubblewrap >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }; \
		else echo "note: bubblewrap (bwrap) is not installed: agents run unsandboxed, sandbox tests are skipped"; fi; }

# Debian's Chromium for the console's browser tests (Playwright drives it; no browser download of its own).
# Installed where apt is usable as root; elsewhere the browser tests skip (and fail under CI).
browser-tools:
	@command -v chromium >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; \
		else echo "note: chromium is not installed: the console's browser tests are skipped"; fi; }

# The real agent CLIs the tests drive (Codex CLI, Claude Code, Gemini CLI, OpenCode, aider), at the versions
# pinned in tests/agents/, into $${JOCH_AGENT_CACHE:-~/.cache/joch-agents}; a no-op when that cache is current.
# Without npm or a Python 3.10-3.12 the CLIs that need it are left out: their tests skip (and fail under CI).
agent-clis: venv-dev
	@scripts/agent-clis || { [ -z "$$CI" ] && echo "note: some agent CLIs are missing: their tests are skipped"; }

# The suite runs on TEST_WORKERS pytest-xdist processes (most tests wait on subprocesses and sockets, so
# more workers than cores pays), a module at a time: a module's tests stay in order on one worker
# (tests/conftest.py). `make test TEST_WORKERS=0` runs it in this process, one test after another.
TEST_WORKERS ?= 4
test: venv-dev postgres-up sandbox-tools browser-tools agent-clis lint typecheck
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

# `make lock` keeps every pin that still satisfies pyproject.toml; `make lock LOCK_FLAGS=--upgrade` takes the newest.
LOCK_FLAGS ?=
lock: venv-dev
	$(BIN)/uv pip compile --quiet --universal --python-version 3.11 $(LOCK_FLAGS) --extra dev \
		pyproject.toml requirements-build.in -o requirements-dev.lock
	$(BIN)/uv pip compile --quiet --universal --python-version 3.11 $(LOCK_FLAGS) \
		pyproject.toml requirements-build.in -c requirements-dev.lock -o requirements.lock

bench: venv-dev postgres-up
	$(BIN)/python bench/store_bench.py

bench-runs: venv-dev
	$(BIN)/python bench/run_bench.py

bench-watch-memory: venv-dev
	$(BIN)/python bench/watch_memory.py

# CEL policies: evaluation time per object, HTTP apply with 10 Policies x 5 rules vs without (target >= 0.70).
bench-policy: venv-dev
	$(BIN)/python bench/policy.py

# Governance on every write: auth + RBAC + 10 Policies x 5 rules + audit rows vs the server from before
# issue 8 (87397d6), SQLite and Postgres, alternating rounds (target >= 0.70); and policy evaluation per object.
bench-governance: venv-dev postgres-up
	$(BIN)/python bench/governance_bench.py

# Single-object creates over HTTP (4 client processes, token auth, audit, admission) vs the raw SQLite
# transaction from 4 writer processes, alternating rounds (target >= 1,000/s).
# Single-object creates over HTTP: 4 server processes against one process of the code before issue 12's work.
bench-http: venv-dev
	$(BIN)/python bench/http_create_bench.py --workers 4 --compare 9f8e177

# joch server's start to /readyz, against the code before the MCP SDK and the kind routes were made lazy.
bench-start: venv-dev
	$(BIN)/python bench/server_start_bench.py --compare 9727a8c

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache $(DATA_DIR)
