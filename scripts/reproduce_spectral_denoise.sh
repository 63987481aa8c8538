#!/usr/bin/env bash
# Spectral denoising vs DP-LoRA on SST-2 (CPU-sized, offline): 3 seeds x epsilon 3, 8.
# Prints the steps-to-target table (mean +- std over seeds) and the denoising overhead ratio.
#   DPBENCH_DATA_ROOT=/path/to/data scripts/reproduce_spectral_denoise.sh [extra overrides]
# SST-2 is read from $DPBENCH_DATA_ROOT/SST-2 when set, else through Hugging Face `datasets`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
OUT=${OUT:-outputs/multirun/spectral_sst2}
export HF_HUB_OFFLINE=1 WANDB_MODE=${WANDB_MODE:-disabled}
$PY -m dpbench -m experiment=spectral_sst2 method=dplora,spectral_denoise privacy=eps3,eps8 \
    seed=0,1,2 logger=none trainer.progress=false \
    hydra.sweep.dir="$OUT" "$@"
$PY -m dpbench.analysis.steps_to_target "$OUT" | tee "$OUT/steps_to_target.md"
$PY -m dpbench.analysis.overhead experiment=spectral_sst2 privacy=eps8 \
    trainer.eval_every_steps=0 "$@" | tee "$OUT/overhead.txt"
