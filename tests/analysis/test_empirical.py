"""The report's joint table: utility, accounted epsilon, audit and MIA in their own columns."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpbench.analysis.empirical import empirical_series, empirical_table
from dpbench.analysis.report import build_report
from dpbench.analysis.results import load_frame
from dpbench.logging.records import write_record
from dpbench.privacy.composition import compose_ledgers

#: a private record's epsilon is re-derived from its ledger by every reader: a real one
LEDGER = [{"sample_rate": 0.1, "noise_multiplier": 4.0, "steps": 20, "queries": [
    {"name": "gradient", "sensitivity": 1.0, "noise_std": 4.0}]}]
SPENT = compose_ledgers([LEDGER], 1e-5, "pld")


def _record(seed: int, accuracy: float, **extra) -> dict:
    return {"method": "dpsgd", "method_name": "dpsgd", "dataset": "digits", "model": "mlp",
            "privacy": "eps1", "target_epsilon": 1.0, "epsilon": SPENT, "private": True,
            "noise_multiplier": 4.0, "sample_rate": 0.1, "steps": 20, "delta": 1e-5,
            "accountant": "pld", "privacy_ledger": LEDGER,
            "seed": seed, "status": "completed", "metrics": {"accuracy": accuracy}, **extra}


MIA = {"kind": "mia", "mia_attack": "rmia", "mia_auc": 0.52, "mia_auc_low": 0.47,
       "mia_auc_high": 0.58, "mia_tpr_at_0p1pct_fpr": 0.0, "mia_tpr_at_0p1pct_fpr_low": 0.0,
       "mia_tpr_at_0p1pct_fpr_high": 0.01, "mia_tpr_at_1pct_fpr": 0.02,
       "mia_tpr_at_1pct_fpr_low": 0.0, "mia_tpr_at_1pct_fpr_high": 0.05,
       "mia_epsilon_lower": 0.0}


def _write_cell(root):
    write_record(root / "u0", _record(0, 0.80))
    write_record(root / "u1", _record(1, 0.82))
    write_record(root / "a0", _record(0, 0.70, kind="audit", epsilon_lower=0.1,
                                      audit_power=3.0, epsilon_claimed=SPENT))
    write_record(root / "m0", _record(0, 0.10, **MIA))  # a weak target: must not pool


def test_joint_table_keeps_each_kind_in_its_own_columns(tmp_path):
    _write_cell(tmp_path)
    table = empirical_table(load_frame(tmp_path))
    assert len(table) == 1
    row = table.iloc[0]
    assert row["accuracy"].startswith("0.8100 ±") and "(n=2)" in row["accuracy"]
    assert row["accuracy (MIA targets)"] == "0.1000 (n=1)"
    assert row["epsilon_lower (audit)"] == "max 0.100 (seed 0 of 1)"
    assert row["audit power"] == "3.0000 (n=1)"
    assert row["MIA AUC"] == "0.5200 [0.4700, 0.5800] (n=1)"
    assert row["TPR@1%FPR"] == "0.0200 [0.0000, 0.0500] (n=1)"
    assert row["attack"] == "rmia"


def test_report_never_pools_mia_targets_with_the_utility_runs(tmp_path):
    _write_cell(tmp_path)
    _, markdown = build_report(tmp_path)
    utility = markdown.split("\n\n")[0]
    assert "0.8100 ± " in utility and "(n=2)" in utility  # the MIA target's 0.10 left out
    assert "Privacy measured beside utility" in markdown and "MIA AUC" in markdown
    assert (tmp_path / "empirical.csv").is_file()
    assert (tmp_path / "privacy_empirical.png").read_bytes()[:4] == b"\x89PNG"


def _mia_config(pool: int, epochs: int = 30) -> dict:
    return {"trainer": {"epochs": epochs, "batch_size": 32, "progress": False},
            "dataset": {"name": "digits"}, "model": {"name": "mlp"},
            "mia": {"pool_size": pool, "references": 4, "seed": 0}, "seed": 0,
            "paths": {"output_root": "outputs"}}


def test_mia_runs_are_grouped_by_their_settings_and_copies_count_once(tmp_path):
    """Two copies of seed 0 plus a run with another pool size and epoch count: not "n = 3"."""
    write_record(tmp_path / "a" / "m0", _record(0, 0.1, **MIA, config=_mia_config(200)))
    write_record(tmp_path / "b" / "m0", _record(0, 0.1, **MIA, config=_mia_config(200)))
    other = {**MIA, "mia_auc": 0.6, "mia_epsilon_lower": 0.3}
    write_record(tmp_path / "c" / "m0", _record(1, 0.1, **other,
                                                 config=_mia_config(400, epochs=10)))
    table = empirical_table(load_frame(tmp_path))
    assert len(table) == 2  # separated: one row per measurement setting
    by_setting = table.set_index("setting")
    first = by_setting.loc["mia.pool_size=200, trainer.epochs=30"]
    assert first["MIA AUC"] == "0.5200 [0.4700, 0.5800] (n=1)"
    assert first["runs"] == "1 (1 copies left out)"
    second = by_setting.loc["mia.pool_size=400, trainer.epochs=10"]
    assert second["MIA epsilon_lower"] == "max 0.300 (seed 1 of 1)"


def test_epsilon_lower_over_seeds_is_the_largest_with_its_seed_never_a_t_interval(tmp_path):
    for seed, lower in enumerate((0.0, 0.4, 0.1)):
        write_record(tmp_path / f"m{seed}", _record(seed, 0.1, **{
            **MIA, "mia_epsilon_lower": lower, "mia_epsilon_ceiling": 3.0 - seed / 10},
            config=_mia_config(200)))
    row = empirical_table(load_frame(tmp_path)).iloc[0]
    assert row["MIA epsilon_lower"] == "max 0.400 (seed 1 of 3; ceiling 2.800)"
    assert "±" not in row["MIA epsilon_lower"] and row["warning"] == ""


def test_a_lower_bound_above_the_accounted_epsilon_is_flagged(tmp_path):
    write_record(tmp_path / "m0", _record(0, 0.1, **{**MIA, "mia_epsilon_lower": 2.05},
                                          config=_mia_config(200)))
    _, markdown = build_report(tmp_path)
    row = empirical_table(load_frame(tmp_path)).iloc[0]
    assert row["warning"] == f"mia_epsilon_lower 2.050 > {SPENT:.3f} (seed 0)"
    assert row["warning"] in markdown


@pytest.mark.parametrize("key, value", [("mia_auc", "abc"), ("mia_auc", 1.5),
                                        ("mia_tpr_at_1pct_fpr", -0.1),
                                        ("mia_epsilon_lower", -1.0),
                                        ("mia_epsilon_lower", math.nan),
                                        ("epsilon_lower", "high")])
def test_report_refuses_a_record_with_bad_measured_numbers_in_one_line(tmp_path, key, value):
    write_record(tmp_path / "good", _record(0, 0.1, **MIA))
    bad = tmp_path / "colleague"
    bad.mkdir()  # a colleague's record: written by hand, no MAC
    (bad / "results.json").write_text(json.dumps(_record(1, 0.1, **{**MIA, key: value})))
    frame, markdown = build_report(tmp_path)
    lines = [line for line in markdown.splitlines() if "colleague" in line]
    assert len(lines) == 1 and key in lines[0] and "results.json" in lines[0], lines
    assert "Unreadable results" in markdown
    assert empirical_table(frame).iloc[0]["MIA AUC"].startswith("0.5200")  # the good one


def test_dpbench_report_refuses_the_bad_record_as_a_user_runs_it(tmp_path):
    bad = tmp_path / "sweep" / "colleague"
    bad.mkdir(parents=True)
    (bad / "results.json").write_text(json.dumps(_record(1, 0.1, **{**MIA, "mia_auc": "abc"})))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([str(Path(sys.executable).parent / "dpbench-report"),
                           str(tmp_path / "sweep")], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mia_auc is not a number in [0, 1]" in done.stdout


def test_the_panel_places_every_private_run_at_its_accounted_epsilon(tmp_path):
    """A fixed-noise run (no target) is a DP point, not a non-private level; the x value is
    the accounted epsilon, not the target."""
    write_record(tmp_path / "t", _record(0, 0.1, **MIA))  # target 1.0, accounted SPENT
    fixed = {**_record(0, 0.1, **{**MIA, "mia_auc": 0.6}), "privacy": "sigma",
             "target_epsilon": None}
    write_record(tmp_path / "f", fixed)
    write_record(tmp_path / "n", {**_record(0, 0.1, **{**MIA, "mia_auc": 0.7}),
                                  "method": "nonprivate", "private": False, "epsilon": math.inf,
                                  "target_epsilon": None, "privacy_ledger": []})
    lines = dict(empirical_series(load_frame(tmp_path), "mia_auc"))
    points = lines["dpsgd"]
    assert [round(e, 9) for e, _ in points] == [round(SPENT, 9)] * 2  # both at the accounted
    assert sorted(i.mean for _, i in points) == [0.52, 0.6]
    assert lines["dpsgd (non-private)"] == 0.7


def test_a_warning_from_any_attack_not_only_the_headline_is_flagged(tmp_path):
    block = {"exceeds_accounted": ["lira_online"], "attacks": {
        "lira_online": {"epsilon": {"epsilon_lower": 1.288}},
        "rmia": {"epsilon": {"epsilon_lower": 0.235}}}}
    write_record(tmp_path / "m1", _record(1, 0.1, **{**MIA, "mia_epsilon_lower": 0.235},
                                          mia=block, privacy_violation=True))
    row = empirical_table(load_frame(tmp_path)).iloc[0]
    assert row["warning"] == f"epsilon_lower of lira_online 1.288 > {SPENT:.3f} (seed 1)"


def test_a_panel_line_runs_across_epsilons_and_splits_on_other_settings(tmp_path):
    for eps, pool in ((1.0, 200), (8.0, 200), (1.0, 400)):
        config = {**_mia_config(pool), "privacy": {"name": f"eps{eps:g}",
                                                   "target_epsilon": eps}}
        write_record(tmp_path / f"m{eps:g}-{pool}",
                     {**_record(0, 0.1, **MIA, config=config), "target_epsilon": eps})
    lines = dict(empirical_series(load_frame(tmp_path), "mia_auc"))
    assert sorted(lines) == ["dpsgd [mia.pool_size=200]", "dpsgd [mia.pool_size=400]"]
    assert len(lines["dpsgd [mia.pool_size=200]"]) == 2  # eps 1 and eps 8 on one line
    assert len(lines["dpsgd [mia.pool_size=400]"]) == 1
