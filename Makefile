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

# victoria-metrics: VictoriaMetrics and vmalert, the second engine the rules are tested on.
system-packages:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null \
	    || ! command -v prometheus-alertmanager >/dev/null \
	    || ! command -v victoria-metrics >/dev/null || ! command -v vmalert >/dev/null \
	    || ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then \
	  echo "installing Prometheus, promtool, Alertmanager, VictoriaMetrics, Slurm and munge from the OS packages"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus prometheus-alertmanager \
	    victoria-metrics slurm-wlm munge >/dev/null; \
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

# Three workers on two cores: most tests wait on Prometheus, Alertmanager, torchrun or a trainer
# rather than compute (1,500 tests take about 11 CPU-minutes in 18 wall-minutes when run one by one);
# loadscope sends each module (each class) to one worker, so a module's shared fixture runs once:
# with worksteal, the VictoriaMetrics run (95 s: two Prometheus servers, VictoriaMetrics, vmalert, two
# trainers) was set up on all three workers at once, in one CI run.
# --no-loadscope-reorder keeps tests/conftest.py's order (the slowest modules first): xdist's default
# sorts modules by their number of tests, which started the one-test modules that take minutes (the
# Slurm loop, the campaign, the install) last, so the run ended with two workers idle for minutes.
# A process the tests started that outlives them fails the run, named (tests/leftover_check.py).
PYTEST_WORKERS ?= 3
pytest: env system-packages
	$(BIN)/pytest -q --durations=60 -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder

test: lint typecheck generate-check pytest

demo: demo-env demo-packages
	@echo "==> babysitter demo (about two and a half minutes)"
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
