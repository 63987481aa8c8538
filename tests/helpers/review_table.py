"""The line counts of docs/privacy-review.md, generated from the files themselves.

    python -m tests.helpers.review_table --write      (from the repository root)

rewrites each table between ``<!-- review:<name> -->`` and ``<!-- /review:<name> -->`` in
docs/privacy-review.md from ``TABLES`` (file, what to read) and the files' ``wc -l``;
``tests/test_privacy_review.py`` fails when the page differs from what this writes.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "privacy-review.md"

#: table name -> [(file, what to read in it)]
TABLES: dict[str, list[tuple[str, str]]] = {
    "release": [
        ("dpbench/privacy/plan.py", "`plan_privacy` (rate, steps, delta, calibrated sigma), "
         "`StepPlan` (the frozen plan of every step; `gradient_noise_std` is the one place the "
         "noise std is computed), `account_release` (ledger + accountant, refuses a release "
         "below the calibrated sigma)"),
        ("dpbench/privacy/ledger.py", "`Query`, `combined_noise_multiplier`, "
         "`PrivacyLedger.record`; `run_event` (the ledger as a dp-accounting `DpEvent`), "
         "`to_json` / `from_json`"),
        ("dpbench/privacy/verify.py", "`event_epsilon` (the run's accountant on the event "
         "alone, read by its recorded `mechanism.convention`), `dp_accounting_epsilon` "
         "(dp-accounting's own accountant under a relation the convention names; other pairs "
         "refused), `event_pld_epsilon` and `pld_epsilon` (dp-accounting's generic PLD, a "
         "second path)"),
        ("dpbench/training/sampling.py", "`poisson_loader` (Opacus's `DPDataLoader` at rate "
         "q), `training_loader` (the dispatch on `trainer.sampler`), `remaining_batches` (a "
         "resumed epoch)"),
        ("dpbench/training/user_sampling.py", "privacy.unit=user: `UserPoissonSampler` "
         "(Poisson over users at q_u, whole users), `uls_loader`, `els_dataset` (the capped "
         "rows)"),
        ("dpbench/privacy/user_plan.py", "`plan_user_privacy` (rate over users or kept "
         "examples, delta below 1/U, sigma calibrated by the strategy's accountant)"),
        ("dpbench/training/step.py", "`clipped_aggregate` (the sensitivity check, always on), "
         "`private_release` (the only code given the noise stream), `apply_release` (what the "
         "update and the mechanism's `advance` are handed: released values only)"),
        ("dpbench/training/loop.py", "`run_plan`, `Trainer.__init__` (plan, the two halves, "
         "step plan, streams), `_context`, `train_step`, `_emit` (what callbacks are handed: "
         "`LoopView`), `fit`"),
        ("dpbench/methods/base.py", "`DPMethod.halves` (the update is built from the name, the "
         "settings and the optimiser factory: never the mechanism), `Halves`"),
        ("dpbench/methods/mechanism.py", "`Mechanism` (DP-SGD's defaults, `advance`), "
         "`flat_clip_factors`, `gradient_queries`"),
        ("dpbench/methods/dpsgd.py", "`FlatClipping`: DP-SGD's mechanism"),
        ("dpbench/methods/context.py", "`StepContext`, `Released`, `HeldOut`: values, all an "
         "update and `advance` are handed"),
        ("dpbench/utils/seeding.py", "one spawned seed per stream"),
    ],
    "resume": [
        ("dpbench/training/run_state.py", "`restore_privacy_state`"),
        ("dpbench/privacy/record_check.py", "`check_ledger`, `ledger_history`, "
         "`accounted_steps`"),
    ],
    "settings": [
        ("dpbench/spec.py", "`build_spec`: the one pass of checks (seed, `tuned=` choice, "
         "`PrivacyConfig`, `TrainerConfig`, the method against `privacy.enabled`, "
         "sampler/relation/accountant via `resolve_sampling`); `RunSpec` (frozen)"),
        ("dpbench/experiment.py", "`build` / `run`: the spec's `privacy` and `trainer` go to "
         "the Trainer unchanged"),
    ],
}


def lines(path: str) -> int:
    """Return ``wc -l`` of ``path``."""
    return (REPO / path).read_bytes().count(b"\n")


def render(name: str) -> str:
    """Return table ``name`` as Markdown, with its total."""
    rows = TABLES[name]
    out = ["| file | what to read | lines |", "|---|---|---|"]
    out += [f"| `{path}` | {what} | {lines(path)} |" for path, what in rows]
    total = sum(lines(path) for path, _ in rows)
    out += ["", f"In all: {len(rows)} files, {total:,} lines (`wc -l` of each whole file)."]
    return "\n".join(out)


def rendered(page: str) -> str:
    """Return ``page`` with every generated table rewritten."""
    for name in TABLES:
        pattern = re.compile(rf"(<!-- review:{name} -->\n)(?:.*?\n)?(<!-- /review:{name} -->)",
                             re.S)
        if not pattern.search(page):
            raise ValueError(f"docs/privacy-review.md has no review:{name} block")
        page = pattern.sub(lambda m, n=name: m.group(1) + render(n) + "\n" + m.group(2), page)
    return page


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true", help="rewrite the page in place")
    args = parser.parse_args()
    page = PAGE.read_text()
    new = rendered(page)
    if args.write:
        PAGE.write_text(new)
    print("up to date" if new == page else ("rewritten" if args.write else "stale"))


if __name__ == "__main__":
    main()
