#!/usr/bin/env bash
# The dp_adaln reproduction (conf/reproduce/dp_adaln.yaml): its sweeps, tables and claims.
#   scripts/reproduce_dp_adaln.sh [--scale cpu|paper] [--seeds 0,1,2] [--jobs 2] [--data-root DIR] [--out outputs]
# Same options for every paper: see `python -m dpbench.analysis.reproduce --help`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PY:-python}" -m dpbench.analysis.reproduce dp_adaln "$@"
