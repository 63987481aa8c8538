#!/usr/bin/env bash
# FIBER / DiSK / DP-AdamBC / DP-AdamW / BandMF (correlated-noise baseline): accuracy x epsilon
# table, FIBER ablation table and the
# wall-clock ratio per step, at CPU scale (experiment=fiber_mnist_cpu).
#   scripts/reproduce_fiber.sh [OUT=outputs/fiber] [SEEDS=0,1,2] [EPS=eps1,eps2,eps4,eps8]
#                              [ABL_EPS=eps1] [PARALLEL=1] [extra hydra overrides...]
# Paper scale on a GPU: PRESET=fiber_cifar100_vit (or fiber_cifar10) scripts/reproduce_fiber.sh
# Writes $OUT/{grid,ablation}/<job>/results.json, $OUT/bench.json and $OUT/tables.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}
OUT=${OUT:-outputs/fiber}
SEEDS=${SEEDS:-0,1,2}
EPS=${EPS:-eps1,eps2,eps4,eps8}
ABL_EPS=${ABL_EPS:-eps1}
PRESET=${PRESET:-fiber_mnist_cpu}
PARALLEL=${PARALLEL:-1}   # >1: run the method groups as that many concurrent processes
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} WANDB_MODE=${WANDB_MODE:-disabled}
# data: DPBENCH_DATA_ROOT (an offline copy) if set, else torchvision downloads MNIST
COMMON=(experiment=$PRESET logger=none trainer.progress=false "$@")

jobs_list=()
for m in dpadamw disk dpadam_bc fiber bandmf; do
  jobs_list+=("$OUT/grid/$m|method=$m privacy=$EPS seed=$SEEDS")
done
jobs_list+=("$OUT/ablation/filter|method=fiber method.settings.filter=ema privacy=$ABL_EPS seed=$SEEDS")
jobs_list+=("$OUT/ablation/correction|method=fiber method.settings.correction=standard,none privacy=$ABL_EPS seed=$SEEDS")

run_job() {
  local dir=${1%%|*} args=${1#*|}
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  nice -n 10 "$PY" -m dpbench -m "${COMMON[@]}" $args hydra.sweep.dir="$dir" \
    > "$dir.log" 2>&1 || echo "some runs failed: see $dir.log"
}

running=0
for j in "${jobs_list[@]}"; do
  run_job "$j" &
  running=$((running + 1))
  if [ "$running" -ge "$PARALLEL" ]; then wait -n; running=$((running - 1)); fi
done
wait

nice -n 10 "$PY" scripts/bench_fiber_step.py --out "$OUT/bench.json" --preset "$PRESET" "$@"
"$PY" scripts/fiber_tables.py "$OUT" --out "$OUT/tables.md"
