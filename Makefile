# dpbench: `make help` lists the targets.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.DEFAULT_GOAL := help

.PHONY: help setup demo test test-data test-full lint format bench clean reproduce-fiber \
        reproduce-dp-adaln reproduce-bounded-adaclip reproduce-dp-ivon reproduce-spectral


help:  ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-22s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,llm]'
	touch $(STAMP)

setup: $(STAMP)  ## create .venv and install dpbench with the dev and llm extras

demo: $(STAMP)  ## the default DP run, offline, no data root (scikit-learn digits), prints the result
	env -u DPBENCH_DATA_ROOT WANDB_MODE=offline $(BIN)/dpbench

test: $(STAMP)  ## the test suite CI runs: no data root, no network (slow and data tests excluded)
	$(BIN)/pytest -m "not slow and not data" -q

test-data: $(STAMP)  ## checks of the real data files under DPBENCH_DATA_ROOT (required)
	@if [ -z "$${DPBENCH_DATA_ROOT:-}" ]; then \
	  echo "make test-data: set DPBENCH_DATA_ROOT to the folder holding the data sets" >&2; \
	  exit 2; fi
	@if [ ! -d "$${DPBENCH_DATA_ROOT}" ]; then \
	  echo "make test-data: DPBENCH_DATA_ROOT=$${DPBENCH_DATA_ROOT} is not a folder" >&2; \
	  exit 2; fi
	$(BIN)/pytest -m data -q

test-full: $(STAMP)  ## every test but the data checks, slow ones included
	$(BIN)/pytest -m "not data" -q

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check .

format: $(STAMP)  ## ruff format + import sort
	$(BIN)/ruff check --fix --select I .
	$(BIN)/ruff format .

bench: $(STAMP)  ## DP step time / non-private step time per model and grad-sample mode
	$(BIN)/dpbench-bench

reproduce-fiber: $(STAMP)  ## FIBER/DiSK/DP-AdamBC vs DP-AdamW: accuracy x eps, ablation, time per step (CPU)
	PY=$(BIN)/python scripts/reproduce_fiber.sh

reproduce-dp-adaln: $(STAMP)  ## DP-aware AdaLN-Zero vs DP-vanilla, ETTh1 imputation, cpu scale (table + figure)
	PY=$(BIN)/python scripts/reproduce_dp_adaln.sh cpu

reproduce-spectral: $(STAMP)  ## spectral_denoise vs dplora on SST-2 (CPU): steps-to-target table, overhead
	PY=$(BIN)/python scripts/reproduce_spectral_denoise.sh

clean:  ## remove run outputs (keeps .venv)
	rm -rf outputs/runs outputs/multirun

reproduce-bounded-adaclip: $(STAMP)  ## bounded adaptive clipping: 4 clipping methods x 3 seeds (cpu scale), table + Pareto plots
	PY=$(BIN)/python scripts/reproduce_bounded_adaclip.sh cpu outputs/bounded_adaclip_cpu

reproduce-dp-ivon: $(STAMP)  ## DP-IVON-Gradsq vs DP-SGD/DP-Adam, CPU scale: tables in outputs/dp_ivon/cpu
	PYTHON=$(BIN)/python scripts/reproduce_dp_ivon.sh cpu
