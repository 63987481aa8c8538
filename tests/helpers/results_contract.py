"""What every ``results.json`` must hold for reports and outside checkers (a test helper)."""

from __future__ import annotations

import math

from dpbench.utils.conf import PRECISIONS

#: top-level keys a results record always carries, whatever the method
REQUIRED_KEYS = ("method", "dataset", "model", "seed", "target_epsilon", "epsilon", "delta",
                 "noise_multiplier", "sample_rate", "steps", "accountant", "metrics",
                 "wall_time_s", "status", "environment")

#: what the ``environment`` block says (versions, device, threads, CPU kernels, dirty tree)
ENVIRONMENT_KEYS = ("python", "torch", "opacus", "dp_accounting", "numpy", "device",
                    "device_name", "torch_threads", "cpu_capability", "git_dirty")


def contract_problems(record: dict) -> list[str]:
    """Return what is wrong with ``record`` (empty when it meets the contract).

    A failed run only has to say so; a finished private run needs a finite epsilon within its
    target, delta in (0, 1), a sampling rate in (0, 1] and a positive noise multiplier.
    """
    problems = [f"missing {key}" for key in REQUIRED_KEYS if key not in record]
    if problems or record["status"] in ("failed", "error"):
        return problems
    if not isinstance(record["metrics"], dict) or not record["metrics"]:
        problems.append("no metrics")
    env = record["environment"]
    if not isinstance(env, dict):
        problems.append("environment is not a mapping")
    else:
        problems += [f"environment has no {key}" for key in ENVIRONMENT_KEYS
                     if env.get(key) is None]  # a finished run imported torch: all are known
    if record["status"] == "completed":  # how it ran: processes, precision, their devices
        world, devices = record.get("world_size"), record.get("devices")
        if not isinstance(world, int) or world < 1:
            problems.append(f"world_size {world!r} is not a process count")
        elif not isinstance(devices, list) or len(devices) != world:
            problems.append(f"devices {devices!r} do not list the {world} processes")
        if record.get("precision") not in PRECISIONS:
            problems.append(f"precision {record.get('precision')!r} is not one of {PRECISIONS}")
    if record["method"] == "nonprivate":
        return problems
    epsilon, target = record["epsilon"], record["target_epsilon"]
    if not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon):
        problems.append("a private run without a finite epsilon")
    elif isinstance(target, (int, float)) and math.isfinite(target) and \
            epsilon > target * (1 + 1e-6):
        problems.append(f"epsilon {epsilon} above its target {target}")
    if not 0 < record["delta"] < 1:
        problems.append(f"delta {record['delta']} outside (0, 1)")
    if not 0 < record["sample_rate"] <= 1:
        problems.append(f"sample rate {record['sample_rate']} outside (0, 1]")
    if not record["noise_multiplier"] or record["noise_multiplier"] <= 0:
        problems.append("a private run without noise")
    return problems
