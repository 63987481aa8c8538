#!/usr/bin/env bash
# The CUDA checks in one command, for a GPU machine held for a few minutes (docs/engine.md,
# "Checking the CUDA path"): the device test suite, console-script runs on the device
# (scripts/device_runs.sh), then dpbench-bench on the device.
#   bash scripts/device_check.sh [OUT_DIR] [extra pytest arguments, e.g. -k "not minilm"]
# (-k "not minilm" leaves out the two checks that need the packaged MiniLM)
# Run from the repository root with a python3 that has dpbench's dependencies (an installed
# venv, or the machine's torch plus carried wheels and PYTHONPATH=.). Writes OUT_DIR/device.txt,
# test_device.log, runs.jsonl, runs.log and bench_cuda.md (default OUT_DIR: outputs/device).
set -uo pipefail
out=${1:-outputs/device}
shift || true
mkdir -p "$out"
python3 - <<'PY' 2>&1 | tee "$out/device.txt" || exit 2
import torch
assert torch.cuda.is_available(), "no CUDA device on this machine"
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))
PY
status=0
DPBENCH_TEST_DEVICE=cuda python3 -m pytest -m device -q -p no:cacheprovider tests/test_device.py \
  "$@" 2>&1 | tee "$out/test_device.log" || status=1
bash scripts/device_runs.sh "$out" || status=1
python3 -m dpbench.bench --device cuda --models mlp cnn2 resnet18 --modes bk hooks ghost \
  --opacus-modes hooks ghost --reps 10 --rounds 3 2>&1 | tee "$out/bench_cuda.md" || status=1
exit $status
