"""Tables built from results.json records: intervals, verdicts, significant bold, escaping."""

from __future__ import annotations

import json

from dpbench.analysis.results import load_frame
from dpbench.analysis.tables import baseline_table, cell_table, latex_table
from tests.helpers.report_records import with_ledger


def _write(root, name, method, seed, acc, eps=3.0, status="completed"):
    run = root / name
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(with_ledger({
        "method": method, "method_name": method, "dataset": "digits", "model": "mlp",
        "seed": seed, "target_epsilon": eps, "epsilon": eps, "status": status,
        "metrics": {"accuracy": acc}, "tuning": {"mode": "unaccounted",
                                                  "chosen": {"method.optimizer.lr": 0.1}}})))


def test_tables_report_intervals_verdicts_and_survive_bad_files(tmp_path):
    for s, (a, b) in enumerate([(0.90, 0.80), (0.91, 0.82), (0.92, 0.81)]):
        _write(tmp_path, f"a{s}", "fiber", s, a)
        _write(tmp_path, f"b{s}", "dpsgd", s, b)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("[1, 2]")
    frame = load_frame(tmp_path)
    assert (frame["status"] == "unreadable").sum() == 1
    table = cell_table(frame, "accuracy")
    assert "(n=3)" in table.loc[("fiber", "digits", "mlp", "unaccounted"), "eps=3"]
    versus = baseline_table(frame, "accuracy", "dpsgd")
    assert versus.iloc[0]["verdict"] == "better" and versus.iloc[0]["n_pairs"] == 3
    assert r"\textbf{0.910" in latex_table(frame, "accuracy")


def test_latex_bolds_nothing_without_a_significant_difference(tmp_path):
    for s, (a, b) in enumerate([(0.90, 0.91), (0.80, 0.79), (0.85, 0.86)]):
        _write(tmp_path, f"a{s}", "fi_ber", s, a)
        _write(tmp_path, f"b{s}", "dpsgd", s, b)
    tex = latex_table(load_frame(tmp_path), "accuracy")
    assert r"\textbf" not in tex and r"fi\_ber" in tex


def test_fixed_sigma_runs_are_one_cell_per_noise_level(tmp_path):
    """A sigma grid (no target epsilon) is not pooled into one column: each noise multiplier
    is its own cell, ordered after any target epsilons, and pairs only within its level."""
    for sigma, offset in ((0.5, 0.0), (2.0, -0.3)):
        for s in range(3):
            for method, acc in (("dp_adaln", 0.8 + offset + 0.01 * s), ("dpsgd", 0.7 + offset)):
                name = f"{method}-{sigma}-{s}"
                _write(tmp_path, name, method, s, acc, eps=None)
                path = tmp_path / name / "results.json"
                record = json.loads(path.read_text())
                path.write_text(json.dumps({**record, "private": True,
                                            "noise_multiplier": sigma}))
    frame = load_frame(tmp_path)
    table = cell_table(frame, "accuracy")
    assert list(table.columns) == ["sigma=0.5", "sigma=2"]
    assert "0.8100 ± " in table.loc[("dp_adaln", "digits", "mlp", "unaccounted"), "sigma=0.5"]
    assert "(n=3)" in table.loc[("dp_adaln", "digits", "mlp", "unaccounted"), "sigma=2"]
    versus = baseline_table(frame, "accuracy", "dpsgd")
    assert sorted(versus["eps"]) == ["sigma=0.5", "sigma=2"]
    assert set(versus["n_pairs"]) == {3} and set(versus["verdict"]) == {"better"}


def test_sigma_grid_is_a_curve_in_the_privacy_utility_plot(tmp_path):
    """Private runs at fixed noise multipliers are points at the epsilon they spent, one per
    multiplier; only a method without private runs becomes a non-private reference level."""
    from dpbench.analysis.plots import privacy_utility, utility_curves
    from dpbench.privacy.composition import compose_ledgers

    spent = {}
    for sigma, acc in ((0.5, 0.9), (2.0, 0.7)):
        # a private record's epsilon is re-derived from its ledger: it carries a real one
        ledger = [{"sample_rate": 0.05, "noise_multiplier": sigma, "steps": 20, "queries": [
            {"name": "gradient", "sensitivity": 1.0, "noise_std": sigma}]}]
        spent[sigma] = compose_ledgers([ledger], 1e-5, "pld")
        for s in range(2):
            name = f"adaln-{sigma}-{s}"
            _write(tmp_path, name, "dp_adaln", s, acc + 0.01 * s, eps=None)
            path = tmp_path / name / "results.json"
            record = json.loads(path.read_text())
            path.write_text(json.dumps({
                **record, "private": True, "noise_multiplier": sigma, "epsilon": spent[sigma],
                "sample_rate": 0.05, "steps": 20, "delta": 1e-5, "accountant": "pld",
                "privacy_ledger": ledger}))
    for s in range(2):
        _write(tmp_path, f"np-{s}", "nonprivate", s, 0.95, eps=None)
    frame = load_frame(tmp_path)
    curves = utility_curves(frame, "accuracy")
    assert [eps for eps, _ in curves["dp_adaln"]] == [spent[2.0], spent[0.5]]
    assert [round(i.mean, 6) for _, i in curves["dp_adaln"]] == [0.705, 0.905]
    assert curves["nonprivate"] == 0.95
    privacy_utility(frame, "accuracy", tmp_path / "pu.png")
    assert (tmp_path / "pu.png").stat().st_size > 0
