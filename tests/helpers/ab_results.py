"""A/B of a refactor: tiny runs of every registered method under every engine it supports.

    python -m tests.helpers.ab_results OUT.json      (from the repository root)

Runs the per-method tiny configs of tests/helpers/method_matrix.py (the privacy tests' own)
in one process, each under every engine ``method_mode_params`` lists, plus the one-run audit
of DP-SGD with its mechanism intact and broken on purpose (noise, clipping), and writes the
records (``results.json``'s fields) without their timing fields. Two trees' files are equal
exactly when every method released, accounted and evaluated the same.
"""

from __future__ import annotations

import json
import math
import sys
import time

from dpbench.audit.cli import run_audit
from dpbench.config.compose import compose_config
from dpbench.experiment import build_trainer
from tests.helpers.cli import QUIET_CLI
from tests.helpers.method_matrix import method_mode_params, method_overrides

#: fields that measure time or name the checkout, not what ran
TIMING = {"wall_time_s", "seconds", "denoise_seconds_total", "git_commit", "git_dirty"}
AUDIT = ("audit.canaries=64", "audit.guesses_included=12", "audit.guesses_excluded=0")


def untimed(value):
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def main() -> None:
    out: dict[str, object] = {}
    for param in method_mode_params():
        name, mode = param.values
        start = time.perf_counter()
        cfg = compose_config([*QUIET_CLI, *method_overrides(name, mode)], config_name="config")
        out[f"{name}-{mode}"] = untimed(build_trainer(cfg, None).fit())
        print(f"{name}-{mode}: {time.perf_counter() - start:.1f}s", flush=True)
    for broken in ("none", "noise", "clipping"):
        cfg = compose_config([*QUIET_CLI, *method_overrides("dpsgd"), *AUDIT,
                              f"audit.break_mechanism={broken}"], config_name="audit")
        out[f"audit-dpsgd-{broken}"] = untimed(run_audit(cfg))
        print(f"audit {broken}", flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1, sort_keys=True, default=str)


if __name__ == "__main__":
    main()
