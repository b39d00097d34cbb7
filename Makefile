# The two set-up commands of the README:
#   make demo   — builds the environment and runs `babysitter demo` (a real run babysat end to end)
#   make test   — builds the environment and runs every check CI runs (ruff, mypy, generate --check, pytest)
# Both work on a fresh Debian machine as root (or with sudo for the apt step).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch; pinned so pip never resolves an open range to a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: env system-packages test lint typecheck generate-check pytest demo clean gpu-check

system-packages:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null \
	    || ! command -v prometheus-alertmanager >/dev/null \
	    || ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then \
	  echo "installing Prometheus, promtool, Alertmanager, Slurm and munge from the OS packages"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus prometheus-alertmanager \
	    slurm-wlm munge >/dev/null; \
	fi

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

env: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"

lint: env
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: env
	$(BIN)/mypy

generate-check: env
	$(BIN)/babysitter generate --check

pytest: env system-packages
	$(BIN)/pytest -q

test: lint typecheck generate-check pytest

demo: env system-packages
	$(BIN)/babysitter demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# On a machine with an NVIDIA GPU: the tests marked `gpu` plus a report, benchmarks/results/gpu.md
# (within 8 minutes). Elsewhere it says why and exits 0. Uses .venv when it exists, else $(PYTHON):
# a GPU machine usually has its own CUDA build of torch.
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
GPU_CHECK_ARGS ?=
gpu-check:
	PYTHONPATH=src $(GPU_PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)
