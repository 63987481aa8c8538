# dpbench: `make help` lists the targets.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.DEFAULT_GOAL := help

.PHONY: help setup lock demo test test-quick test-processes test-privacy test-numerics test-data test-device test-full lint format bench clean privacy-audit reproduce reproduce-fiber \
        reproduce-dp-adaln reproduce-bounded-adaclip reproduce-dp-ivon reproduce-spectral \
        reproduce-samplers reproduce-mia reproduce-user-level


help:  ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-22s %s\n", $$1, $$2}'

# The exact versions `make setup` installs (pip-tools' pip-compile of pyproject.toml's ranges
# with the dev and llm extras, resolved on CPython 3.11; docs/testing.md). Another Python, or
# `make setup LOCK=`, installs from the ranges instead.
LOCK    ?= $(shell $(PY) -c 'import sys; print("requirements.lock" if sys.version_info[:2] == (3, 11) else "")')
PIP_COMPILE := $(BIN)/pip-compile --quiet --allow-unsafe --strip-extras --extra dev --extra llm \
               --no-emit-index-url --no-emit-find-links

$(STAMP): pyproject.toml $(LOCK)
	$(PY) -m venv $(VENV)
ifeq ($(strip $(LOCK)),)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,llm]'
else
	$(BIN)/pip install -q -r $(LOCK)
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
endif
	touch $(STAMP)

setup: $(STAMP)  ## create .venv and install dpbench, dev and llm extras, at the locked versions

lock: $(STAMP)  ## re-resolve requirements.lock after a change to pyproject.toml (ARGS=--upgrade: newest)
	$(PIP_COMPILE) $(ARGS) -o requirements.lock pyproject.toml

demo: $(STAMP)  ## the default DP run, offline, no data root (scikit-learn digits), prints the result
	env -u DPBENCH_DATA_ROOT WANDB_MODE=offline $(BIN)/dpbench

# Tiers (docs/testing.md): test-quick is the edit-test loop, test what CI and the README run,
# test-processes the tests whose object is a fresh process (signals, torchrun, submitit, the
# console scripts; part of test), test-privacy the per-method privacy matrix alone (also part
# of test). WORKERS: pytest-xdist's
# -n (auto: one worker per core; 0: one process, no xdist); loadgroup keeps the tests of one
# xdist_group (one shared fixture) on one worker.
WORKERS ?= auto
PYTEST  := $(BIN)/pytest -q -n $(WORKERS) --dist loadgroup
QUICK   := not slow and not data and not device and not privacy_matrix and not integration

test: $(STAMP)  ## the suite CI runs, in parallel: no data root, no network (slow, data, device left out)
	$(PYTEST) --durations=15 -m "not slow and not data and not device"

test-processes: $(STAMP)  ## fresh processes alone: signals, torchrun, submitit, console scripts (also part of test)
	$(PYTEST) --durations=10 -m "processes and not slow and not data and not device"

test-quick: $(STAMP)  ## unit and structural tests: no whole runs, subprocesses or privacy matrix
	$(PYTEST) -m "$(QUICK)"

test-privacy: $(STAMP)  ## ledger, sensitivity and audit of every method under every engine
	$(PYTEST) -m "privacy_matrix and not slow and not data and not device"

# The tests with numerical equalities, on each CPU kernel set PyTorch can pick: another
# machine's kernels round float32 differently (docs/testing.md).
NUMERICS_TESTS := tests/models tests/training tests/methods tests/privacy tests/tasks \
                  tests/test_numerics.py
CPU_CAPABILITIES ?= default avx2

test-numerics: $(STAMP)  ## the numerical tests under each ATEN_CPU_CAPABILITY (default, avx2)
	@set -e; for cap in $(CPU_CAPABILITIES); do \
	  echo "== ATEN_CPU_CAPABILITY=$$cap"; \
	  ATEN_CPU_CAPABILITY=$$cap $(PYTEST) -m "not slow and not data and not device" \
	    -p no:cacheprovider $(NUMERICS_TESTS); \
	done

test-data: $(STAMP)  ## checks of the real data files under DPBENCH_DATA_ROOT (required)
	@if [ -z "$${DPBENCH_DATA_ROOT:-}" ]; then \
	  echo "make test-data: set DPBENCH_DATA_ROOT to the folder holding the data sets" >&2; \
	  exit 2; fi
	@if [ ! -d "$${DPBENCH_DATA_ROOT}" ]; then \
	  echo "make test-data: DPBENCH_DATA_ROOT=$${DPBENCH_DATA_ROOT} is not a folder" >&2; \
	  exit 2; fi
	$(PYTEST) -m data

test-device: $(STAMP)  ## the accelerator checks, on a GPU machine (DPBENCH_TEST_DEVICE, default cuda)
	$(BIN)/pytest -m device -q

test-full: $(STAMP)  ## every test but the data and device checks, slow and processes ones included
	$(PYTEST) --durations=15 -m "not data and not device"

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check .

format: $(STAMP)  ## ruff format + import sort
	$(BIN)/ruff check --fix --select I .
	$(BIN)/ruff format .

bench: $(STAMP)  ## DP step time / non-private step time per model and grad-sample mode
	$(BIN)/dpbench-bench

# The privacy table over every method's tiny test config (tests/helpers/privacy_matrix.py: ledger
# check, sensitivity, audit; ARGS=--canaries N), then the fault and bad-input tests.
PRIVACY_TESTS := tests/test_bad_input.py tests/training/test_faults.py \
                 tests/privacy/test_ledger_check.py tests/training/test_sensitivity.py tests/audit

privacy-audit: $(STAMP)  ## every method x (ledger check, sensitivity, audit), then the fault tests
	PYTHONPATH=. nice -n 10 $(BIN)/python -m tests.helpers.privacy_matrix $(ARGS)
	PYTHONPATH=. $(BIN)/python -m pytest -q $(PRIVACY_TESTS)

clean:  ## remove run outputs (keeps .venv)
	rm -rf outputs/runs outputs/multirun

REPRODUCE := $(BIN)/python -m dpbench.runners.reproduce

reproduce: $(STAMP)  ## every CPU-scale reproduction spec, then outputs/claims/claims.md (one claim a row)
	$(REPRODUCE) all $(ARGS)

reproduce-fiber: $(STAMP)  ## FIBER/DiSK/DP-AdamBC vs DP-AdamW, lr tuned per epsilon, + ablation (CPU)
	$(REPRODUCE) fiber $(ARGS)

reproduce-bounded-adaclip: $(STAMP)  ## bounded adaptive clipping vs unbounded, AUTO-S, constant (CPU)
	$(REPRODUCE) bounded_adaclip $(ARGS)

reproduce-dp-ivon: $(STAMP)  ## DP-IVON-Gradsq vs DP-SGD/DP-Adam, lr tuned per epsilon (CPU)
	$(REPRODUCE) dp_ivon $(ARGS)

reproduce-spectral: $(STAMP)  ## spectral denoising vs DP-LoRA on SST-2: steps to target (CPU)
	$(REPRODUCE) spectral $(ARGS)

reproduce-dp-adaln: $(STAMP)  ## DP-aware AdaLN-Zero vs DP-vanilla, ETTh1 imputation (CPU)
	$(REPRODUCE) dp_adaln $(ARGS)

reproduce-samplers: $(STAMP)  ## Poisson vs fixed-size vs shuffled batches at equal valid epsilon / noise (CPU)
	$(REPRODUCE) samplers $(ARGS)

reproduce-mia: $(STAMP)  ## membership inference: each seed method vs DP-SGD at equal accounted epsilon (CPU)
	$(REPRODUCE) mia $(ARGS)

reproduce-user-level: $(STAMP)  ## user-level DP: ULS vs ELS at user-level epsilon 1 and 8 (CPU)
	$(REPRODUCE) user_level $(ARGS)
