# Everything runs inside .venv, created on first use from the project's own files.
# `make demo` installs what the runtime needs and pytest (for an app's own tests); `make test`
# adds the dev extra (Spark, faust-streaming for the benchmarks, the test tools, the docs
# site's builder).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BASE   := $(VENV)/.installed-base
DEV    := $(VENV)/.installed-dev
# The docs site's builder; the variable silences mkdocs-material's notice about MkDocs 2.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs
# Broker tests mostly wait on group rounds: seven workers overlap those waits.
TEST_WORKERS ?= 7

.PHONY: setup demo test test-fast test-long lint docs bench clean

setup: $(DEV)

$(VENV)/bin/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Relay needs Python 3.11 or newer (PYTHON=$(PYTHON))")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip 'setuptools>=64' wheel

# --no-compile: pip would byte-compile every installed module (Spark's and the plotting
# library's thousands among them, a quarter of the install's CPU); Python compiles, and
# caches, only the modules a run imports. --no-build-isolation: Relay's own editable wheel
# is built with the venv's setuptools, not in a fresh environment of its own each time.
$(BASE): pyproject.toml $(VENV)/bin/python
	$(PY) -m pip install --quiet --no-compile --no-build-isolation -e '.[testing]'
	@touch $(BASE)

$(DEV): pyproject.toml $(VENV)/bin/python
	$(PY) -m pip install --quiet --no-compile --no-build-isolation -e '.[dev]'
	@touch $(DEV) $(BASE)

demo: $(BASE)
	$(PY) -m examples.demo

lint: $(DEV)
	$(PY) -m ruff check .

# --strict: a broken link, a missing anchor or a docstring that cannot be rendered fails.
docs: $(DEV)
	$(MKDOCS) build --strict

# Both tiers: tests/unit (no broker, no process, no sleep) and tests/broker. The broker tier
# comes first so that its long waits start early and the quick unit tests fill the end; the
# long simulations try a third of their cases (see docs/testing.md).
test: $(DEV)
	@bash .ci/install-chromium
	$(PY) -m ruff check .
	$(MKDOCS) build --strict --quiet
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup \
		tests/broker tests/unit

# The unit tier with every case of the long simulations and 500 hypothesis examples each
# (RELAY_TEST_LONG): run it when changing the assignor or the protocol.
test-long: $(DEV)
	PYTHONDONTWRITEBYTECODE= RELAY_TEST_LONG=1 $(PY) -m pytest -q -n 2 tests/unit

# The unit tier alone (see docs/testing.md): no broker starts; the long simulations run
# a fifth of their cases (RELAY_TEST_FAST), `make test` a third, `make test-long` all.
# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set: without it, each run (and
# each xdist worker and worker process) compiles every module and rewrites every test
# module's asserts again (10 s of a 2-core machine).
test-fast: $(DEV)
	PYTHONDONTWRITEBYTECODE= RELAY_TEST_FAST=1 $(PY) -m pytest -q -n 2 tests/unit

bench: $(DEV)
	$(PY) -m benchmarks.restore --records 1000000 --json results/restore.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis site
