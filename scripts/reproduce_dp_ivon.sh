#!/usr/bin/env bash
# DP-IVON-Gradsq vs DP-SGD / DP-Adam: accuracy / NLL / ECE / Brier x epsilon tables.
#
#   scripts/reproduce_dp_ivon.sh [cpu|paper] [OUT]
#
# cpu   (default): experiment=dp_ivon_cifar10_cpu, the 2-layer CNN on 8000 CIFAR-10 images,
#       epsilon {1, 2, 4, 8} x seeds {0, 1, 2} at B 256, plus B 64 at epsilon {1, 8}
#       (the small-batch check). Set DPBENCH_DATA_ROOT (or PATHS) to the data folder.
# paper (GPU): experiment=dp_ivon_cifar10, ResNet-18 (GroupNorm) on the full CIFAR-10,
#       epsilon {1, 2, 4, 8} x B {256, 1024, 4096} x C {1, 5} x seeds {0, 1, 2}.
# Writes OUT/<method>/<job>/results.json (+ reliability.png per run), then
# OUT/dp_ivon_tables.md (mean +- std over seeds) and OUT/dp_ivon_runs.csv.
# Rerunning resumes: completed runs are skipped (trainer.resume=true). Environment: PYTHON,
# LOGGER (none | wandb), SEEDS, EPS, METHODS (a subset of "dp_ivon dpsgd dpadam").
set -euo pipefail
cd "$(dirname "$0")/.."
SCALE=${1:-cpu}
OUT=${2:-outputs/dp_ivon/$SCALE}
PY=${PYTHON:-python}
LOGGER=${LOGGER:-none}  # LOGGER=wandb logs every run (offline unless WANDB_MODE says otherwise)
SEEDS=${SEEDS:-0,1,2}
EPS=${EPS:-1,2,4,8}
METHODS=${METHODS:-dp_ivon dpsgd dpadam}  # e.g. METHODS=dpsgd to run one stream per shell

case "$SCALE" in
  cpu)
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: shared CPUs thrash
    EXP=dp_ivon_cifar10_cpu
    GRIDS=("trainer.batch_size=256 privacy.target_epsilon=$EPS"
           "trainer.batch_size=64 privacy.target_epsilon=1,8")
    # per-method knobs (kept out of the preset so the baselines can reuse it)
    IVON_ARGS="method.optimizer.lr=3.0 method.optimizer.beta2=0.99"
    SGD_ARGS="method.optimizer.lr=3.0"
    ADAM_ARGS="method.optimizer.lr=0.005"
    ;;
  paper)
    EXP=dp_ivon_cifar10
    GRIDS=("trainer.batch_size=256,1024,4096 privacy.clip_norm=1,5 privacy.target_epsilon=$EPS")
    IVON_ARGS="method.optimizer.lr=2.0 method.optimizer.hess_init=0.5"  # untuned (no GPU here)
    SGD_ARGS="method.optimizer.lr=2.0"
    ADAM_ARGS="method.optimizer.lr=0.001"
    ;;
  *) echo "usage: $0 [cpu|paper] [OUT]" >&2; exit 2 ;;
esac

for method in $METHODS; do
  case $method in
    dp_ivon) ARGS=$IVON_ARGS ;; dpsgd) ARGS=$SGD_ARGS ;; dpadam) ARGS=$ADAM_ARGS ;;
  esac
  for g in "${!GRIDS[@]}"; do
    # shellcheck disable=SC2086  # word splitting of the grid and argument strings is intended
    nice -n 10 "$PY" -m dpbench -m experiment=$EXP method=$method seed=$SEEDS \
      ${GRIDS[$g]} $ARGS logger=$LOGGER trainer.progress=false trainer.resume=true \
      hydra.sweep.dir="$OUT/$method/grid$g" 'hydra.sweep.subdir=${hydra.job.num}_${run_name}'
  done
done
"$PY" scripts/dp_ivon_table.py "$OUT" --out "$OUT"
