"""What dpbench-audit and dpbench-mia print beside their row: the ceiling notes and the
warnings, each naming its figures."""

from __future__ import annotations

import math

from dpbench.audit.cli import audit_messages, table_row
from dpbench.audit.mia.cli import mia_messages


def _audit(lower: float, lower_fdp: float, claimed: float = 8.0) -> dict:
    audit = {"epsilon_lower": lower, "epsilon_lower_fdp": lower_fdp, "power": 7.38,
             "ceiling": 7.38, "ceiling_fdp": 15.16, "canaries": 40000, "guesses": 17130,
             "correct": 17130, "exceeds_claimed": [n for n, v in (
                 ("epsilon_lower", lower), ("epsilon_lower_fdp", lower_fdp)) if v > claimed]}
    return {"method": "dpsgd", "dataset": "digits", "epsilon_claimed": claimed,
            "epsilon_lower": lower, "audit": audit}


def test_audit_names_the_ceiling_it_cannot_see_past_and_warns_on_the_fdp_bound():
    record = _audit(7.38, 15.16)
    lines = audit_messages(record)
    assert any("epsilon_lower cannot exceed 7.38 with 40000 canaries and 17130 guesses: this "
               "measurement cannot detect a violation above 7.38 (the claim is 8)" in line
               for line in lines)
    assert not any("epsilon_lower_fdp cannot exceed" in line for line in lines)
    assert ("dpbench-audit: WARNING epsilon_lower_fdp = 15.16 exceeds the claimed epsilon 8: "
            "the mechanism that ran is less private than accounted") in lines
    assert not any("WARNING epsilon_lower =" in line for line in lines)
    assert "| 7.38 | 7.38 | 15.16 | 15.16 | 17130 / 17130 |" in table_row(record)


def test_an_honest_audit_below_both_ceilings_prints_nothing():
    record = _audit(0.5, 0.6, claimed=2.0)
    assert audit_messages(record) == []


def _mia(lower: float, eps: float, ceiling: float = 3.3) -> dict:
    attack = {"epsilon": {"epsilon_lower": lower, "evaluated": 200, "ceiling": ceiling}}
    return {"epsilon": eps, "mia_attack": "rmia", "mia_epsilon_ceiling": ceiling,
            "mia": {"attacks": {"rmia": attack},
                    "exceeds_accounted": ["rmia"] if lower > eps else []}}


def test_mia_warns_naming_both_figures_and_notes_its_ceiling():
    assert mia_messages(_mia(2.048, 0.999)) == [
        "dpbench-mia: WARNING rmia epsilon_lower = 2.048 exceeds the accounted epsilon 0.999: "
        "the mechanism that ran is less private than accounted"]
    (note,) = mia_messages(_mia(1.28, 8.0))
    assert "cannot detect a violation above 3.3 (the accounted epsilon is 8)" in note
    assert "200 evaluated examples" in note
    assert mia_messages(_mia(0.05, math.inf)) == []  # no claim to violate
