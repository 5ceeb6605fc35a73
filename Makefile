# Everything runs inside .venv, created on first use from the project's own files.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Relay needs Python 3.11 or newer (PYTHON=$(PYTHON))")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo

lint: $(STAMP)
	$(PY) -m ruff check .

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m benchmarks.restore --records 1000000 --json results/restore.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
