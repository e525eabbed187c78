# Two entry points for a fresh machine (see README): `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup test lint check demo services bench docs soak

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: 2.13.0 is what pip serves here (its CUDA build, ~3 GB, runs on the
	# CPU and stays in pip's cache); unpinned, anything depending on torch pulls a newer one
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

setup: $(BIN)/.installed

services:
	bash .ci/services.sh

lint: setup
	$(BIN)/ruff check stream workers tests bench deploy
	$(BIN)/ruff format --check stream workers tests bench deploy
	$(BIN)/mypy stream workers tests bench

# Two test files at a time (pytest-xdist, a file's tests on one worker so its module fixtures
# start once): most of the suite waits on brokers, Redis and timeouts, not on a core.
# ~22 min on 2 cores against ~38 in one process (TEST_WORKERS=0).
TEST_WORKERS ?= 2
test: setup services lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# For contributors: lint, types and every test that needs no service (no broker, no Redis)
# and is not marked slow -- a broken Scorer or Runtime shows here in minutes.
check: lint
	$(BIN)/python -m pytest -q -m "not integration and not slow" -n $(TEST_WORKERS) --dist loadfile

# Not in `make test`: the three workers on Apache Kafka for 30 minutes (MINUTES=...), memory
# sampled all along; figures in BENCHMARKS.md ("Soak").
MINUTES ?= 30
soak: setup services
	$(BIN)/python -m bench.soak --minutes $(MINUTES) --out var/soak

# The docs site (MkDocs Material, mkdocs.yml) into var/site, strictly: a broken link or a page
# outside the nav fails it. Its generated pages (configuration, CLI reference, benchmarks,
# deploying, home) come from the code at build time; the backtest's HTML report from its JSON.
docs: setup
	$(BIN)/reval report docs/backtest
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/reval demo $(ARGS)
