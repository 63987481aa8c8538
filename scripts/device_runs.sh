#!/usr/bin/env bash
# Console-script runs on the device (docs/engine.md, "Checking the CUDA path"): every method
# family, each engine, bf16, the samplers, user-level DP, a seed group, the audit and
# membership inference, each a fresh process under its own timeout, from outside the repository.
#   bash scripts/device_runs.sh OUT_DIR     (from the repository root; called by device_check.sh)
# Writes OUT_DIR/runs.jsonl (one line a run: status, epsilon, sigma, steps, engine, metrics) and
# OUT_DIR/runs.log (each run's last lines). The runs that read real files (CIFAR-10, ETTh1)
# run when DPBENCH_DATA_ROOT is set. Exit status 1 if any run failed.
set -uo pipefail
out=$(cd "${1:?OUT_DIR}" && pwd)
work=$(mktemp -d)
status=0
run() {  # NAME SECONDS MODULE OVERRIDES...
  local name=$1 seconds=$2 module=$3; shift 3
  local start=$SECONDS
  (cd "$work" && timeout "$seconds" python3 -m "$module" "$@" trainer.device=auto logger=none \
    trainer.progress=false "hydra.run.dir=$work/$name" "hydra.sweep.dir=$work/$name" \
    > "$work/$name.log" 2>&1)
  local rc=$?
  [ $rc -eq 0 ] || status=1
  { echo "=== $name (rc $rc, $((SECONDS - start)) s): $module $*"; tail -20 "$work/$name.log"; } \
    >> "$out/runs.log"
  python3 - "$work/$name" "$name" "$rc" >> "$out/runs.jsonl" <<'PY'
import json, pathlib, sys
folder, name, rc = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
keep = ("status", "epsilon", "noise_multiplier", "steps", "grad_sample_mode", "metrics")
for path in sorted(folder.rglob("results.json")) or [None]:  # a sweep: one line a job
    record = json.loads(path.read_text()) if path else {}
    print(json.dumps({"run": name, "rc": rc, **{k: record.get(k) for k in keep}}))
PY
}
run demo 120 dpbench
run bf16 120 dpbench trainer.precision=bf16-mixed trainer.epochs=3
run ghost 120 dpbench trainer.grad_sample_mode=ghost trainer.epochs=3
run hooks 120 dpbench trainer.grad_sample_mode=hooks trainer.epochs=3
run dp_ivon 120 dpbench method=dp_ivon trainer.epochs=3
run bounded_adaclip 120 dpbench method=bounded_adaclip trainer.epochs=3
run disk 120 dpbench method=disk trainer.epochs=3
run dpadam_bc 120 dpbench method=dpadam_bc trainer.epochs=3
run shuffle 120 dpbench trainer.sampler=shuffle trainer.epochs=3
run user 120 dpbench privacy.unit=user trainer.epochs=3
run bandmf 120 dpbench method=bandmf trainer.epochs=3
run adaclip 120 dpbench method=adaclip trainer.epochs=3
run seed_group 180 dpbench -m seed=0,1,2,3 trainer.seeds_at_once=4 trainer.epochs=3
run audit 120 dpbench.audit.cli
run mia 180 dpbench.audit.mia.cli
if [ -n "${DPBENCH_DATA_ROOT:-}" ]; then
  run fiber_cifar10 180 dpbench experiment=fiber_cifar10_cpu method=fiber trainer.epochs=2
  run dp_adaln_etth1 180 dpbench experiment=dp_adaln_etth1_forecast_cpu method=dp_adaln \
    trainer.epochs=2
  run vit_cifar10 240 dpbench experiment=fiber_cifar10_cpu method=fiber model=pretrained \
    model.weights=false model.resolution=64 trainer.epochs=1
  run vit_bf16 240 dpbench experiment=fiber_cifar10_cpu method=dpsgd model=pretrained \
    model.weights=false model.resolution=64 trainer.epochs=1 trainer.precision=bf16-mixed
fi
rm -rf "$work"
exit $status
