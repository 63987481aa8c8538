"""Print the privacy table: every registered method x (ledger check, sensitivity, audit).

    python -m tests.helpers.privacy_matrix [--canaries 1000] [--epochs 2]   (from the repo root)

It lives with the tests because it reports on them: it runs the per-method tiny configs of
tests/helpers/method_matrix.py and the neighbouring-batch helpers of tests/helpers/sensitivity.py
(`make privacy-audit` runs it, then the fault and bad-input tests). Columns: epsilon
reported by Opacus vs epsilon recomputed by dp-accounting's PLD from the ledger; the largest
||sum(D) - sum(D')|| / sensitivity over the neighbouring-batch cases; the one-run audit's
epsilon_lower vs epsilon_claimed (and the same with noise or clipping switched off, dpsgd).
"""

from __future__ import annotations

import argparse
import math

from dpbench.audit.cli import run_audit
from dpbench.config.compose import compose_config
from dpbench.experiment import build_trainer
from dpbench.privacy.verify import pld_epsilon
from tests.helpers.cli import QUIET_CLI
from tests.helpers.method_matrix import all_methods, is_private, method_overrides
from tests.helpers.sensitivity import adversarial_example, aggregate, distance, trained_trainer


def compose_with(name: str, *overrides: str):
    return compose_config([*QUIET_CLI, *overrides], config_name=name)


def sensitivity_ratio(method: str) -> float:
    trainer = trained_trainer(method)
    state = trainer.noise_generator.get_state()
    data = trainer.data.train
    base = [data[i] for i in range(1, 17)]
    worst = 0.0
    for d, d2 in ((base, base + [adversarial_example(trainer.data)]), (base, base[1:])):
        agg, ctx = aggregate(trainer, d, state)
        agg2, _ = aggregate(trainer, d2, state)
        worst = max(worst, distance(agg, agg2) / trainer.mechanism.sensitivity(ctx))
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
