# kvscope: `make run` brings up the console, `make test` runs every test.
# Both create what they need first: .venv (the console's light environment) and, for the
# embedded engine, .engine-venv (vLLM on CPU, its own environment because vLLM pins torch).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install lint typecheck unit e2e bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

run: install
	$(BIN)/kvscope up

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy app probes planner storage

unit: install
	$(BIN)/pytest -m "not browser and not engine"

test: install lint typecheck
	$(BIN)/pytest

bench: install
	$(BIN)/python -m benchmarks.storage

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache test-artifacts
