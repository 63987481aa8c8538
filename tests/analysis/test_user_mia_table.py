"""The docs' table of membership inference by unit is generated from the runs' records."""

from __future__ import annotations

import json
import subprocess
import sys

from dpbench.analysis.user_mia_table import END, START, rows, unit_of


def _record(unit, strategy, epsilon, auc):
    attack = {"auc": auc, "auc_low": auc - 0.05, "auc_high": auc + 0.05,
              "tpr_at_1pct_fpr": 0.02, "epsilon": {"epsilon_lower": 0.1, "evaluated": 135}}
    return {"kind": "mia", "method": "dpsgd", "epsilon": epsilon,
            "metrics": {"accuracy": 0.5},
            **({"user_level": {"strategy": strategy}} if strategy else {}),
            "mia": {**({"unit": unit} if unit else {}),
                    "attacks": {"lira_online": attack, "rmia": attack}}}


def test_rows_name_the_unit_and_every_shown_attack():
    table = rows([("a", _record(None, None, 1.0, 0.6)), ("b", _record("user", "els", 1.0, 0.5)),
                  ("c", _record("user", None, float("inf"), 0.8))])
    assert len(table) == 2 + 6
    assert unit_of(_record("user", "uls", 1.0, 0.5)) == "user (uls)"
    assert "| a | example | dpsgd | 1.000 | 0.500 | lira_online | 0.600 [0.550, 0.650] |" \
        in table[2]
    assert "| c | user (no unit: non-private) | dpsgd | inf |" in table[6]


def test_the_block_between_the_markers_is_replaced(tmp_path):
    runs = tmp_path / "runs"
    for name, rec in (("x", _record("user", "uls", 1.0, 0.55)),):
        (runs / name).mkdir(parents=True)
        (runs / name / "results.json").write_text(json.dumps(rec))
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{START}\nold\n{END}\nafter\n")
    subprocess.run([sys.executable, "-m", "dpbench.analysis.user_mia_table", str(runs),
                    "--doc", str(doc), "--note", "N."], check=True)
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    assert "| x | user (uls) |" in text and "N." in text
