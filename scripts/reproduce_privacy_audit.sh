#!/usr/bin/env bash
# Privacy verification (docs/privacy.md): the methods x (ledger check, sensitivity, audit) table
# and the fault / bad-input tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PYTHONPATH=. nice -n 10 "$PY" scripts/privacy_matrix.py "$@"
PYTHONPATH=. "$PY" -m pytest -q tests/test_bad_input.py tests/training/test_faults.py \
  tests/privacy/test_ledger_check.py tests/training/test_sensitivity.py tests/audit
