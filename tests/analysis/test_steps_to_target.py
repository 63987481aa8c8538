"""Steps-to-target: first step reaching the baseline's final accuracy, speed-up, epsilon saved."""

from __future__ import annotations

import json
import math

from dpbench.analysis.results import load_records
from dpbench.analysis.steps_to_target import compare_to_baseline, summarise


def _record(method: str, seed: int, accs: list[float], history_acc: float | None = None):
    steps = [3 * (i + 1) for i in range(len(accs))]
    rows = [{"step": s, "epsilon": 0.1 * s, "accuracy": a} for s, a in zip(steps, accs)]
    history = [{"epoch": 1, "step": steps[-1] + 1, "epsilon": 0.1 * (steps[-1] + 1),
                "accuracy": history_acc if history_acc is not None else accs[-1]}]
    return {"status": "completed", "method": method, "method_name": method, "dataset": "sst2",
            "model": "minilm_lora", "seed": seed, "epsilon": history[0]["epsilon"],
            "step_history": rows, "history": history,
            "config": {"method": {"name": method}, "privacy": {"name": "eps3"}, "seed": seed}}


def test_compare_uses_final_baseline_accuracy_and_epsilon():
    base = _record("dplora", 0, [0.5, 0.6, 0.7], history_acc=0.72)  # final row: step 10
    meth = _record("spectral_denoise", 0, [0.55, 0.73, 0.74])
    out = compare_to_baseline(base, meth)
    assert out["target"] == 0.72 and out["baseline_steps"] == 10 and out["steps"] == 6
    assert out["baseline_peak"] == 0.72 and out["method_peak"] == 0.74
    assert math.isclose(out["speedup_pct"], 40.0)
    assert math.isclose(out["epsilon_saved"], 1.0 - 0.6)
    never = compare_to_baseline(base, _record("spectral_denoise", 0, [0.5, 0.6, 0.71]))
    assert not never["reached"] and math.isnan(never["speedup_pct"])


def test_summarise_pairs_seeds_from_results_files(tmp_path):
    runs = [_record("dplora", 0, [0.5, 0.7]), _record("spectral_denoise", 0, [0.7, 0.8]),
            _record("dplora", 1, [0.5, 0.6]), _record("spectral_denoise", 1, [0.5, 0.6]),
            _record("dplora", 2, [0.5, 0.6])]  # seed 2 has no partner: left out
    for i, r in enumerate(runs):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "results.json").write_text(json.dumps(r))
    rows = summarise(load_records(tmp_path))
    assert len(rows) == 1 and rows[0]["seeds"] == 2 and rows[0]["reached"] == "2/2"
    assert rows[0]["speed-up %"].startswith("35.7")  # mean of 1 - 3/7 and 1 - 6/7


def test_summarise_reads_completed_runs_only(tmp_path):
    """The runs are read by the one reader at its default, status ``completed`` (the status
    records have): a run still running or failed is no seed, even with a step history."""
    runs = {"base": _record("dplora", 0, [0.5, 0.7]),
            "method": _record("spectral_denoise", 0, [0.7, 0.8]),
            "running": {**_record("dplora", 1, [0.5, 0.6]), "status": "running"},
            "failed": {**_record("spectral_denoise", 1, [0.5, 0.6]), "status": "failed"}}
    for name, r in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(r))
    rows = summarise(load_records(tmp_path))
    assert len(rows) == 1 and rows[0]["seeds"] == 1
