# The two set-up commands of the README:
#   make demo   — builds the environment and runs `babysitter demo` (a real run babysat end to end)
#   make test   — builds the environment and runs every check CI runs (ruff, mypy, generate --check, pytest)
# Both work on a fresh Debian machine as root (or with sudo for the apt step).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned and installed before the project. On PyPI the Linux x86_64 wheel of torch==2.13.0 is
# the CUDA build (about 2.5 GiB with its CUDA wheels); for the CPU build (183 MiB) add PyTorch's index:
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)

.PHONY: env demo-env demo-packages system-packages test lint typecheck generate-check pytest demo clean gpu-check

# The demo needs Prometheus and Alertmanager only; the tests also start a Slurm cluster.
demo-packages:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null \
	    || ! command -v prometheus-alertmanager >/dev/null; then \
	  echo "==> installing Prometheus, promtool and Alertmanager from the OS packages"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus prometheus-alertmanager >/dev/null; \
	fi

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
	@echo "==> installing $(TORCH) $(TORCH_FROM)"
	$(BIN)/pip install -q $(TORCH_FROM) "$(TORCH)"
	@echo "==> installing babysitter and the test extra (pytest, mypy, ruff, transformers, lightning, OpenTelemetry)"
	$(BIN)/pip install -q -e ".[test]"

# What the demo runs and nothing else: torch (the tiny GPT) and the demo extra (rich, matplotlib).
# pip prints its progress: the torch download is the long step on a fresh machine.
demo-env: $(BIN)/python
	@echo "==> installing $(TORCH) $(TORCH_FROM) for the demo's training run"
	$(BIN)/pip install --progress-bar on $(TORCH_FROM) "$(TORCH)"
	@echo "==> installing babysitter with the demo extra (rich, matplotlib)"
	$(BIN)/pip install --progress-bar on -e ".[demo]"

lint: env
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: env
	$(BIN)/mypy

generate-check: env
	$(BIN)/babysitter generate --check

pytest: env system-packages
	$(BIN)/pytest -q --durations=25

test: lint typecheck generate-check pytest

demo: demo-env demo-packages
	@echo "==> babysitter demo (about 3 minutes)"
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
