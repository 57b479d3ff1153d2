# Workshop — the README's commands. `make test` sets everything up on a fresh
# Debian 12 machine with Python 3.11, then runs the whole suite.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTO_FILES := $(wildcard proto/workshop/v1/*.proto)
PYTEST_ARGS ?=
# pytest-xdist workers: two per core. Most tests wait more than they compute (a restart,
# an outage, a lease, a browser's frame): one worker alone uses about a quarter of a core
# (test_processor_outages.py: 22 s of CPU in 107 s), so two per core keep the cores busy.
TEST_WORKERS ?= $(shell echo $$((2 * $$(nproc))))
# Arguments of `make demo`, e.g. `make demo ARGS=--keep`.
ARGS ?=

.PHONY: setup system-deps lock proto test test-fast screenshots demo demo-stop images lint fmt clean

setup: $(STAMP)

# System packages (Postgres 15, the shared libpython the Triton python backend
# embeds); installs them only when missing and when we may (root + apt).
system-deps:
	@scripts/system-deps.sh

# The venv holds exactly the lock requirements/dev.txt (hashes required, nothing
# resolved at install time) and this project, editable. scripts/setup-venv.sh
# installs the system packages too and lets concurrent `make` runs take turns.
$(STAMP): requirements/dev.txt pyproject.toml
	@scripts/setup-venv.sh $(PYTHON) $(VENV)

# Re-resolves requirements/*.txt from pyproject.toml (keeping the versions a lock
# already names unless a bound excludes them); commit the result.
lock: $(STAMP)
	UV=$(BIN)/uv scripts/lock.sh

# Generated contracts (+ .pyi stubs) live in libs/workshop/v1 and are committed;
# tests/unit/test_contracts.py fails when they differ from what this target writes.
proto: $(STAMP)
	$(BIN)/python -m scripts.gen_proto

# The tests marked `alone`, one after another on a quiet machine (pytest's exit 5, no
# test selected, is no failure), then the rest on every core (pytest-xdist, TEST_WORKERS; each worker
# starts its own Postgres, SeaweedFS and Triton; `--dist worksteal`: a worker that runs out
# takes tests queued for another, so a long test near the end does not leave a core idle).
# Both add to .test-results/durations.txt.
test: $(STAMP)
	$(BIN)/pytest -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]
	WORKSHOP_DURATIONS_CONTINUE=1 $(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal -m "not alone" $(PYTEST_ARGS)

# The edit-test loop: the unit and service layers (tests/unit, tests/service), in parallel.
test-fast: $(STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) -m "not alone" $(PYTEST_ARGS) tests/unit tests/service

# The web console's browser tests, told to write docs/screenshots/*.png (the README's);
# without WORKSHOP_WRITE_SCREENSHOTS=1 (any other test run) they write them to a tmp dir.
screenshots: $(STAMP)
	WORKSHOP_WRITE_SCREENSHOTS=1 $(BIN)/pytest -q tests/system/test_console.py tests/system/test_console_run.py tests/system/test_console_review.py tests/system/test_console_corrections.py tests/system/test_console_queue.py tests/system/test_console_buckets.py tests/system/test_console_editor.py tests/system/test_console_resources.py tests/system/test_console_datasets.py

# The whole system on this machine (Postgres, SeaweedFS, Triton, coordinator, preview,
# gateway, processor) runs a 20-image test run and stops; ARGS=--keep keeps it running
# and first prints how to use it (web console, CLI exports, metrics, doctor).
demo: $(STAMP)
	$(BIN)/python -m tools.demo $(ARGS)

# Stops a demo kept running (`make demo ARGS=--keep`) and its stack: without ARGS the one
# of the default work directory ($TMPDIR/workshop-demo-$USER), naming any other demo that
# still runs; ARGS='--workdir DIR' picks another.
demo-stop: $(STAMP)
	$(BIN)/python -m tools.demo stop $(ARGS)

# Every service image (coordinator, preview, gateway, processor on the CPU, Triton from the
# bundled server), built with podman from a local Debian 12 base, then their sizes
# (docs/deployment.md, "Images"); cached, so a second run with nothing changed is quick.
# IMAGE_TAG (default dev) tags them; IMAGES picks some, e.g. `make images IMAGES=gateway`.
images:
	@scripts/images.sh

# lint-imports checks the import rules of pyproject.toml's [tool.importlinter]
# (docs/architecture.md, "Import rules"); it takes well under a second, so no cache dir.
# gen_sql_params --check fails when a generated SQL parameter module (<room>/<stem>_params.py)
# is stale: `python -m scripts.gen_sql_params` rewrites them.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache --no-logo
	$(BIN)/python -m scripts.gen_sql_params --check
	$(BIN)/buf lint

fmt: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
