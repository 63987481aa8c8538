#!/usr/bin/env bash
# DP-aware AdaLN-Zero vs DP-vanilla (Huang et al., arXiv 2602.22610) on ETTh1 imputation:
# both methods x noise multipliers x seeds, plus the non-private runs of both, then the table
# (RMSE/MAE/MAPE/CRPS/JS/ACF by method x noise, mean +- std over seeds), the g_cond tail
# quantiles and the gradient-tail figure.
#   scripts/reproduce_dp_adaln.sh [cpu|paper] [preset task: etth1_imputation ...]
# env: SEEDS (default 0,1,2), SIGMAS (default 0.5,1,2,4), PY (python), DPBENCH_DATA_ROOT.
# Two sweeps run side by side (one per method); each job uses one thread.
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE=${1:-cpu}
TABLE=${2:-etth1_imputation}
SEEDS=${SEEDS:-0,1,2}
SIGMAS=${SIGMAS:-0.5,1,2,4}
PY=${PY:-python}
: "${DPBENCH_DATA_ROOT:?set DPBENCH_DATA_ROOT to the folder holding ETT-small/}"
export DPBENCH_DATA_ROOT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} WANDB_MODE=${WANDB_MODE:-disabled}
PRESET=dp_adaln_${TABLE}$([ "$SCALE" = cpu ] && echo _cpu || true)
OUT=outputs/dp_adaln/${SCALE}/${TABLE}
COMMON=(experiment="$PRESET" logger=none trainer.progress=false trainer.resume=true)

sweep() {  # $1 method, $2 sub folder, rest: overrides
  local method=$1 sub=$2; shift 2
  $PY -m dpbench -m "${COMMON[@]}" method="$method" seed="$SEEDS" "$@" \
    hydra.sweep.dir="$OUT/$sub" > "$OUT/$sub.log" 2>&1
}
mkdir -p "$OUT"
sweep dp_vanilla dp_vanilla privacy=sigma privacy.noise_multiplier="$SIGMAS" &
sweep dp_adaln dp_adaln privacy=sigma privacy.noise_multiplier="$SIGMAS" &
wait
sweep dp_vanilla nonprivate_vanilla privacy=nonprivate &
sweep dp_adaln nonprivate_adaln privacy=nonprivate &
wait
$PY scripts/dp_adaln_report.py "$OUT"
