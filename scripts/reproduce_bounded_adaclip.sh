#!/usr/bin/env bash
# Bounded adaptive clipping (Zhao et al. 2025): the four clipping methods x 3 seeds on Skewed
# MNIST and Fashion-MNIST (and Dutch census with DUTCH=1), then the worst-class vs macro
# accuracy table and the Pareto plots.
#   scripts/reproduce_bounded_adaclip.sh [cpu|paper] [out_dir]
# cpu: the *_cpu presets (< 30 min per method on 2 cores); paper: the paper's settings (GPU).
# Environment: DATASETS (default "skewed_mnist fashion_mnist"), SEEDS (default 1,2,3),
# DUTCH=1 adds the Dutch census, PY (default python), DPBENCH_DATA_ROOT for offline data.
set -euo pipefail
SCALE=${1:-cpu}
OUT=${2:-outputs/bounded_adaclip_${SCALE}}
PY=${PY:-python}
SEEDS=${SEEDS:-1,2,3}
DATASETS=${DATASETS:-"skewed_mnist fashion_mnist"}
[ "${DUTCH:-0}" = 1 ] && DATASETS="$DATASETS dutch"
suffix=""; [ "$SCALE" = cpu ] && suffix="_cpu"
[ "$SCALE" = cpu ] || [ "$SCALE" = paper ] || { echo "scale must be cpu or paper" >&2; exit 2; }

for ds in $DATASETS; do
  preset="experiment=bounded_adaclip_${ds}${suffix}"
  # constant clipping is DP-SGD with normalised clipping (clip_C(g) / C)
  $PY -m dpbench -m "$preset" method=dpsgd method.settings.normalize=true seed="$SEEDS" \
      logger=none trainer.progress=false hydra.sweep.dir="$OUT/$ds/dpsgd"
  for m in adaclip bounded_adaclip autoclip; do
    $PY -m dpbench -m "$preset" method=$m seed="$SEEDS" \
        logger=none trainer.progress=false hydra.sweep.dir="$OUT/$ds/$m"
  done
done
$PY scripts/bounded_adaclip_report.py "$OUT"
