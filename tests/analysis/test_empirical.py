"""The report's joint table: utility, accounted epsilon, audit and MIA in their own columns."""

from __future__ import annotations

from dpbench.analysis.empirical import empirical_table
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
    assert row["epsilon_lower (audit)"] == "0.1000 (n=1)"
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
