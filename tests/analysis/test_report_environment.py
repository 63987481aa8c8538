"""dpbench-report --environment: runs grouped by the environment they ran in."""

from __future__ import annotations

import json
from pathlib import Path

from dpbench.analysis.report import environment_table, main

ENV = {"python": "3.11.7", "torch": "2.14.1", "opacus": "1.6.0", "dp_accounting": "0.6.0",
       "numpy": "2.4.6", "device": "cpu", "device_name": "Some CPU", "torch_threads": 2,
       "cpu_capability": "AVX2", "git_dirty": False}


def _write(root: Path, name: str, seed: int, **env) -> None:
    record = {"method": "dpsgd", "dataset": "digits", "model": "mlp", "privacy": "eps1",
              "seed": seed, "target_epsilon": 1.0, "epsilon": 0.99, "delta": 1e-5,
              "noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 10, "accountant": "pld",
              "metrics": {"accuracy": 0.9}, "wall_time_s": 1.0, "status": "completed"}
    if env.get("missing"):
        env = None
    else:
        env = {**ENV, **env}
    (root / name).mkdir()
    (root / name / "results.json").write_text(json.dumps({**record, "environment": env}))


def test_runs_are_grouped_by_environment_and_old_records_show_unknown(tmp_path, capsys):
    _write(tmp_path, "a", 0)
    _write(tmp_path, "b", 1)
    _write(tmp_path, "c", 2, cpu_capability="DEFAULT", torch_threads=1)
    _write(tmp_path, "d", 3, missing=True)
    table = environment_table(tmp_path)
    assert sorted(table["runs"].tolist()) == [1, 1, 2]
    assert set(table["cpu_capability"]) == {"AVX2", "DEFAULT", "unknown"}
    assert table.loc[table["cpu_capability"] == "AVX2", "runs"].item() == 2
    assert main([str(tmp_path), "--environment"]) == 0
    out = capsys.readouterr().out
    assert "Environments:" in out and "DEFAULT" in out and "unknown" in out
    assert main([str(tmp_path)]) == 0
    assert "Environments:" not in capsys.readouterr().out
