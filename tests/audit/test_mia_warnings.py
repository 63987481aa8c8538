"""dpbench-mia warns when a measured lower bound exceeds the accounted epsilon, and saves the
scores that recompute its table with scikit-learn.

The warning is tested on a cell whose noise is secretly drawn at 1 % of its scale
(``mia.break_noise_scale``, a test-only switch) while the accountant still claims epsilon
0.2; its honest twin (the same cell, full noise) must stay silent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score, roc_curve

from dpbench.audit.mia.cli import hydra_main
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: a small pool the attacks separate when the noise is off (30 epochs), 3 models
CELL = ("method=dpsgd", "privacy=eps1", "privacy.target_epsilon=0.2", "mia.pool_size=200",
        "mia.population_size=100", "mia.references=2", "mia.bootstrap=20",
        "trainer.epochs=30", "trainer.batch_size=32")


def _launch(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``dpbench-mia`` as a user does: a fresh process from outside the repository."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(Path(sys.executable).parent / "dpbench-mia"), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)


def test_hidden_noise_bug_is_flagged_and_scores_recompute_the_table(tmp_path):
    run_dir = tmp_path / "broken"
    done = _launch([*CELL, "logger=none", "trainer.progress=false", "trainer.device=cpu",
                    "mia.break_noise_scale=0.01", f"hydra.run.dir={run_dir}"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]  # exit code as dpbench-audit's
    record = json.loads((run_dir / "results.json").read_text())
    assert record["privacy_violation"] and "break_noise_scale=0.01" in record["broken_on_purpose"]
    exceeding = record["mia"]["exceeds_accounted"]
    assert exceeding
    for name in exceeding:
        lower = record["mia"]["attacks"][name]["epsilon"]["epsilon_lower"]
        assert lower > record["epsilon"]
        assert (f"WARNING {name} epsilon_lower = {lower:.4g} exceeds the accounted epsilon "
                f"{record['epsilon']:.4g}") in done.stderr
    assert record["mia_epsilon_ceiling"] >= record["mia_epsilon_lower"]
    assert f"| {record['mia_epsilon_ceiling']:.3f} |" in done.stdout  # the ceiling is printed

    # scores.npz: the saved scores recompute every attack's AUC and TPR at 1 % FPR
    with np.load(run_dir / "scores.npz") as saved:
        members = saved["target_members"]
        assert saved["members"].shape == saved["log_p_pool"].shape == (3, 200)
        assert saved["log_p_population"].shape == (3, 100)
        for name, metrics in record["mia"]["attacks"].items():
            scores = saved[f"scores_{name}"]
            assert roc_auc_score(members, scores) == pytest.approx(metrics["auc"], abs=1e-12)
            fpr, tpr, _ = roc_curve(members, scores, drop_intermediate=False)
            assert tpr[fpr <= 0.01].max() == pytest.approx(metrics["tpr_at_1pct_fpr"])
            assert tpr[fpr <= 0.001].max() == pytest.approx(metrics["tpr_at_0p1pct_fpr"])
        assert np.array_equal(saved["scores_loss"], saved["log_p_pool"][0])


def test_the_honest_twin_raises_no_warning(tmp_path, monkeypatch, capfd):
    run_dir = tmp_path / "honest"
    assert run_cli(hydra_main, [*CELL, f"hydra.run.dir={run_dir}"], monkeypatch) == 0
    record = json.loads((run_dir / "results.json").read_text())
    assert not record["privacy_violation"] and record["mia"]["exceeds_accounted"] == []
    assert "broken_on_purpose" not in record
    assert "WARNING" not in capfd.readouterr().err


def test_fair_classification_is_attacked(tmp_path, monkeypatch):
    """dataset=adult (fair classification; its test batches carry the group) on a synthetic
    copy of the UCI files."""
    from tests.helpers.synthetic import write_adult

    write_adult(tmp_path / "data", n_train=150, n_test=60)
    run_dir = tmp_path / "adult"
    code = run_cli(hydra_main, ["method=dpsgd", "privacy=eps1", "dataset=adult",
                                f"paths.data_root={tmp_path / 'data'}", "mia.pool_size=100",
                                "mia.population_size=40", "mia.references=2",
                                "mia.bootstrap=20", "trainer.epochs=1", "trainer.batch_size=16",
                                f"hydra.run.dir={run_dir}"], monkeypatch)
    assert code == 0
    record = json.loads((run_dir / "results.json").read_text())
    assert record["dataset"] == "adult" and record["kind"] == "mia"
    assert 0 <= record["mia_auc"] <= 1 and record["mia_epsilon_ceiling"] > 0
    with np.load(run_dir / "scores.npz") as saved:
        assert saved["log_p_population"].shape == (3, 40)


def test_lira_augment_is_refused_for_tabular_inputs_before_training(tmp_path, monkeypatch,
                                                                    capfd):
    from tests.helpers.synthetic import write_adult

    write_adult(tmp_path / "data", n_train=150, n_test=60)
    run_dir = tmp_path / "adult"
    code = run_cli(hydra_main, ["method=dpsgd", "dataset=adult", "mia.lira_augment=true",
                                f"paths.data_root={tmp_path / 'data'}", "mia.pool_size=100",
                                "mia.population_size=40", f"hydra.run.dir={run_dir}"],
                   monkeypatch)
    err = capfd.readouterr().err
    assert code == 2 and "mia.lira_augment" in err and "trained" not in err
    assert not run_dir.exists()



#: a tiny offline SST-2 cell of the packaged MiniLM with LoRA (after ``paths.data_root``)
TEXT_CELL = ("method=dpsgd", "privacy=eps1", "dataset=sst2", "model=minilm_lora",
             "dataset.train_size=80", "dataset.test_size=40", "dataset.max_length=12",
             "mia.pool_size=80", "mia.population_size=40")


def _synthetic_sst2(tmp_path: Path, monkeypatch) -> str:
    """Write the GLUE-layout SST-2 copy; return its ``paths.data_root`` override."""
    from tests.helpers.synthetic import write_sst2

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_sst2(tmp_path / "data", n_train=120, n_dev=40)
    return f"paths.data_root={tmp_path / 'data'}"


def test_text_classification_is_attacked(tmp_path, monkeypatch):
    """dataset=sst2 with the packaged MiniLM and LoRA, offline, on a synthetic copy of the
    GLUE files: scores on raw sentences (the frozen-prefix cache of ``auto`` stays off)."""
    run_dir = tmp_path / "sst2"
    code = run_cli(hydra_main, [*TEXT_CELL, _synthetic_sst2(tmp_path, monkeypatch),
                                "mia.references=2", "mia.bootstrap=20", "trainer.epochs=1",
                                "trainer.batch_size=16", f"hydra.run.dir={run_dir}"],
                   monkeypatch)
    assert code == 0
    record = json.loads((run_dir / "results.json").read_text())
    assert record["dataset"] == "sst2" and record["kind"] == "mia"
    assert 0 <= record["mia_auc"] <= 1 and record["mia_epsilon_ceiling"] > 0
    with np.load(run_dir / "scores.npz") as saved:
        assert saved["log_p_pool"].shape == (3, 80)
        assert saved["log_p_population"].shape == (3, 40)
        assert np.all(saved["log_p_pool"] <= 0) and np.isfinite(saved["log_p_pool"]).all()
        assert saved["members"].shape == (3, 80) and (saved["members"].sum(axis=1) > 0).all()


def test_text_classification_refuses_a_cached_prefix_before_training(tmp_path, monkeypatch,
                                                                     capfd):
    run_dir = tmp_path / "sst2"
    code = run_cli(hydra_main, [*TEXT_CELL, _synthetic_sst2(tmp_path, monkeypatch),
                                "trainer.cache_frozen_prefix=on", f"hydra.run.dir={run_dir}"],
                   monkeypatch)
    err = capfd.readouterr().err
    assert code == 2 and "trainer.cache_frozen_prefix" in err and "trained" not in err
    assert not run_dir.exists()


def test_time_series_imputation_is_refused_before_training(tmp_path, monkeypatch, capfd):
    """A task without class probabilities (the ETTh1 diffusion imputer) is refused."""
    from tests.helpers.synthetic import write_ett

    write_ett(tmp_path / "data")
    run_dir = tmp_path / "ett"
    code = run_cli(hydra_main, ["method=dpsgd", "privacy=eps1", "dataset=etth1",
                                f"paths.data_root={tmp_path / 'data'}", "dataset.window=8",
                                "dataset.max_train_windows=256", "dataset.max_test_windows=64",
                                "model=dit", "model.hidden=8", "model.depth=1",
                                "mia.pool_size=100", "mia.population_size=40",
                                f"hydra.run.dir={run_dir}"], monkeypatch)
    err = capfd.readouterr().err
    assert code == 2 and "'ts_diffusion' task" in err and "trained" not in err
    assert not run_dir.exists()
