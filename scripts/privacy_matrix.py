"""Print the issue-8 table: every registered method x (ledger check, sensitivity, audit).

    PYTHONPATH=. python scripts/privacy_matrix.py [--canaries 1000] [--epochs 2]

Uses the per-method tiny configs of tests/method_matrix.py. Columns: epsilon reported by
Opacus vs epsilon recomputed by dp-accounting's PLD from the ledger; the largest
||sum(D) - sum(D')|| / sensitivity over the neighbouring-batch cases; the one-run audit's
epsilon_lower vs epsilon_claimed (and the same with noise or clipping switched off, dpsgd).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra import compose, initialize_config_dir  # noqa: E402

from dpbench.audit.cli import run_audit  # noqa: E402
from dpbench.cli import CONF_DIR  # noqa: E402
from dpbench.experiment import build_trainer  # noqa: E402
from dpbench.privacy.verify import pld_epsilon  # noqa: E402
from tests.cli_helpers import QUIET_CLI  # noqa: E402
from tests.method_matrix import all_methods, is_private, method_overrides  # noqa: E402
from tests.training.test_sensitivity import (  # noqa: E402
    _adversary,
    _aggregate,
    _distance,
    _trained_trainer,
)


def compose_with(name: str, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(name, overrides=[*QUIET_CLI, *overrides])


def sensitivity_ratio(method: str) -> float:
    trainer = _trained_trainer(method)
    state = trainer.noise_generator.get_state()
    data = trainer.data.train
    base = [data[i] for i in range(1, 17)]
    worst = 0.0
    for d, d2 in ((base, base + [_adversary(trainer.data)]), (base, base[1:])):
        agg, ctx = _aggregate(trainer, d, state)
        agg2, _ = _aggregate(trainer, d2, state)
        worst = max(worst, _distance(agg, agg2) / trainer.method.sensitivity(ctx))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    # positive guesses only: an included canary that was never sampled cannot be told apart
    audit = (f"audit.canaries={args.canaries}", f"audit.guesses_included={args.canaries // 5}",
             "audit.guesses_excluded=0", f"trainer.epochs={args.epochs}")
    print("| method | epsilon (Opacus) | epsilon (PLD, ledger) | max dS/S | epsilon_claimed "
          "| epsilon_lower | correct/guesses |")
    print("|---|---|---|---|---|---|---|")
    rows = [(m, "none") for m in all_methods()] + [("dpsgd", "noise"), ("dpsgd", "clipping")]
    for method, broken in rows:
        label = method if broken == "none" else f"{method} ({broken} OFF, test only)"
        if not is_private(method):
            print(f"| {label} | inf | n/a (no release) | n/a | inf | not audited | - |")
            continue
        if broken == "none":
            summary = build_trainer(compose_with("config", *method_overrides(method),
                                                 f"trainer.epochs={args.epochs}"), None).fit()
            pld = pld_epsilon(summary["privacy_ledger"], summary["delta"])
            eps, ratio = f"{summary['epsilon']:.4f}", f"{sensitivity_ratio(method):.4f}"
            pld_s = f"{pld:.4f}"
        else:
            eps = pld_s = ratio = "-"
        rec = run_audit(compose_with("audit", *method_overrides(method), *audit,
                                     f"audit.break_mechanism={broken}"))
        a = rec["audit"]
        lower = a["epsilon_lower"]
        print(f"| {label} | {eps} | {pld_s} | {ratio} | {rec['epsilon_claimed']:.4f} | "
              f"{'inf' if math.isinf(lower) else f'{lower:.4f}'} | "
              f"{a['correct']}/{a['guesses']} |", flush=True)


if __name__ == "__main__":
    main()
