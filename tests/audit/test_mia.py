"""``dpbench-mia``: the run kind end to end, its refusals, and the sanity every attack owes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from dpbench.audit.mia.cli import hydra_main, run_mia
from dpbench.utils.conf import CONF_DIR
from tests.helpers.cli import QUIET_CLI, run_cli

pytestmark = pytest.mark.integration  # whole runs or processes: make test, not test-quick

REPO = Path(__file__).resolve().parents[2]
TINY = ("mia.pool_size=60", "mia.population_size=30", "mia.references=2", "mia.bootstrap=20",
        "trainer.epochs=1", "trainer.batch_size=16")
#: a small pool the non-private model overfits (members ~100, 30 epochs)
OVERFIT = ("mia.pool_size=200", "trainer.epochs=30", "trainer.batch_size=32")


def mia_config(*overrides: str):
    from dpbench.config.schema import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("mia", overrides=[*QUIET_CLI, *overrides])


def test_mia_cli_writes_results_roc_and_row(tmp_path, monkeypatch, capfd):
    run_dir = tmp_path / "mia"
    code = run_cli(hydra_main, ["method=dpsgd", "privacy=eps1", *TINY,
                                f"hydra.run.dir={run_dir}"], monkeypatch)
    assert code == 0
    record = json.loads((run_dir / "results.json").read_text())
    assert record["kind"] == "mia" and record["status"] == "completed"
    assert (record["method"], record["dataset"], record["seed"]) == ("dpsgd", "digits", 0)
    assert set(record["mia"]["attacks"]) == {"loss", "lira_offline", "lira_online", "rmia"}
    assert record["mia_attack"] == "rmia"
    assert record["mia_auc_low"] <= record["mia_auc"] <= record["mia_auc_high"]
    # every model is trained under the cell's privacy settings and accounted on its own half
    assert len(record["mia"]["model_epsilons"]) == 3
    assert all(e <= 1.0 * 1.01 for e in record["mia"]["model_epsilons"])
    assert record["epsilon"] == record["mia"]["model_epsilons"][0]
    rows = list(csv.DictReader((run_dir / "roc.csv").open()))
    assert {r["attack"] for r in rows} == set(record["mia"]["attacks"])
    assert all(0 <= float(r["fpr"]) <= 1 and 0 <= float(r["tpr"]) <= 1 for r in rows)
    assert (run_dir / "roc.png").read_bytes()[:4] == b"\x89PNG"
    out = capfd.readouterr()
    assert "| dpsgd | digits |" in out.out
    assert "model 3/3 (reference) trained" in out.err and "ETA" in out.err
    # a rerun sweep with trainer.resume=true hands the finished cell back without training
    args = ["method=dpsgd", "privacy=eps1", *TINY, "trainer.resume=true",
            f"hydra.run.dir={run_dir}"]
    before = (run_dir / "results.json").read_bytes()
    assert run_cli(hydra_main, args, monkeypatch) == 0
    out = capfd.readouterr()
    assert "trained" not in out.err and "| dpsgd | digits |" in out.out
    assert (run_dir / "results.json").read_bytes() == before
    # ... but never a record edited to claim less leakage (its MAC no longer verifies)
    edited = {**record, "mia_tpr_at_1pct_fpr": 0.0}
    (run_dir / "results.json").write_text(json.dumps(edited))
    assert run_cli(hydra_main, args, monkeypatch) == 2
    assert "results.json" in capfd.readouterr().err
    assert json.loads((run_dir / "results.json").read_text()) == edited


@pytest.mark.parametrize("sampler,accountant", [("shuffle", "pld"), ("fixed_size", "rdp")])
def test_every_sampler_is_attacked_at_its_valid_epsilon(sampler, accountant, tmp_path,
                                                         monkeypatch):
    run_dir = tmp_path / "mia"
    code = run_cli(hydra_main, ["method=dpsgd", "privacy=eps1", *TINY,
                                f"trainer.sampler={sampler}", f"privacy.accountant={accountant}",
                                f"hydra.run.dir={run_dir}"], monkeypatch)
    assert code == 0
    record = json.loads((run_dir / "results.json").read_text())
    assert (record["sampler"], record["neighbouring"]) == (sampler, "replace_one")
    # calibrated to the target under the sampler's own accountant, not the Poisson figure
    assert 0.97 <= record["epsilon"] <= 1.0 * 1.01
    assert record["epsilon_if_poisson"] < record["epsilon"]


def test_lira_augment_queries_shifted_images(tmp_path):
    record = run_mia(mia_config("method=dpsgd", "privacy=eps1", *TINY, "mia.lira_augment=true"),
                     tmp_path)
    for name in ("lira_online", "lira_offline"):
        assert record["mia"]["attacks"][name]["augmentations"] == 5
    with __import__("numpy").load(tmp_path / "scores.npz") as saved:
        aug = saved["phi_pool_augmented"]
        assert aug.shape == (3, 5, 60)
        assert (aug[:, 0] == saved["phi_pool"]).all()  # the first copy: the images as they are
        assert not (aug[:, 1] == saved["phi_pool"]).all()


@pytest.mark.parametrize("override, key", [("mia.pool_size=100000", "mia.pool_size"),
                                           ("mia.attacks=[loss,foo]", "mia.attacks"),
                                           ("mia.headline=lira_online", "mia.headline"),
                                           ("trainer.num_threads=0", "num_threads"),
                                           ("privacy.unit=user", "needs at least 8"),
                                           ("privacy.unit=user", "dataset.num_users must be")])
def test_mia_cli_rejects_bad_settings_and_leaves_nothing(tmp_path, monkeypatch, capfd,
                                                         override, key):
    run_dir = tmp_path / "mia"
    extra = {"mia.headline": ["mia.attacks=[loss]"], "needs at least 8": ["dataset.num_users=3"],
             "dataset.num_users must be": ["dataset.num_users=100000"]}.get(key, [])
    code = run_cli(hydra_main, ["method=dpsgd", *TINY, *extra, override,
                                f"hydra.run.dir={run_dir}"], monkeypatch)
    err = capfd.readouterr().err
    assert code == 2 and key in err and "trained" not in err
    assert not run_dir.exists()


def test_mia_never_writes_into_a_training_runs_folder(tmp_path, monkeypatch, capfd):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text(json.dumps({"status": "completed"}))
    code = run_cli(hydra_main, ["method=dpsgd", *TINY, f"hydra.run.dir={run_dir}"],
                   monkeypatch)
    assert code == 2 and "another kind of run" in capfd.readouterr().err
    assert json.loads((run_dir / "results.json").read_text()) == {"status": "completed"}


@pytest.mark.slow
def test_nonprivate_training_on_a_small_pool_is_clearly_attackable():
    record = run_mia(mia_config("method=nonprivate", *OVERFIT))
    for name in ("lira_offline", "lira_online", "rmia"):
        attack = record["mia"]["attacks"][name]
        assert attack["auc_low"] > 0.6, (name, attack["auc"])
        assert attack["tpr_at_1pct_fpr"] > 0.05, (name, attack["tpr_at_1pct_fpr"])


@pytest.mark.slow
@pytest.mark.parametrize("privacy", ["eps1", "eps2"])
def test_attacks_at_small_epsilon_stay_below_the_accounted_epsilon(privacy):
    record = run_mia(mia_config("method=dpsgd", f"privacy={privacy}", *OVERFIT))
    assert record["epsilon"] <= float(privacy[3:]) * 1.01
    for name, attack in record["mia"]["attacks"].items():
        assert attack["epsilon"]["epsilon_lower"] <= record["epsilon"], name
        assert attack["auc_low"] < 0.75, name  # far from the non-private model's leak


@pytest.mark.slow
def test_a_sweep_over_methods_and_epsilons_reports_one_row_per_cell(tmp_path, monkeypatch):
    from dpbench.analysis.report import build_report

    sweep = tmp_path / "sweep"
    code = run_cli(hydra_main, ["-m", "method=dpsgd,dpadam", "privacy=eps1,eps8", *TINY,
                                f"hydra.sweep.dir={sweep}"], monkeypatch)
    assert code == 0
    assert len(list(sweep.glob("*/results.json"))) == 4
    _, markdown = build_report(sweep)
    joint = markdown.split("Privacy measured beside utility")[1]
    rows = [line for line in joint.splitlines() if line.startswith("| dp")]
    assert len(rows) == 4 and all("(n=1)" in row for row in rows)


def test_wandb_gets_every_attack_metric_and_the_cells_epsilon():
    from dpbench.audit.mia.wandb_log import wandb_values

    record = {"epsilon": 0.99, "target_epsilon": 1.0, "metrics": {"accuracy": 0.5},
              "mia": {"attacks": {"rmia": {"auc": 0.6, "auc_low": 0.55, "auc_high": 0.65,
                                           "epsilon": {"epsilon_lower": 0.1, "tpr": 0.2,
                                                       "evaluated": 100}}}}}
    assert wandb_values(record) == {
        "epsilon": 0.99, "target_epsilon": 1.0, "accuracy": 0.5, "mia/rmia/auc": 0.6,
        "mia/rmia/auc_low": 0.55, "mia/rmia/auc_high": 0.65, "mia/rmia/epsilon_lower": 0.1,
        "mia/rmia/epsilon_tpr": 0.2, "mia/rmia/epsilon_evaluated": 100.0}


@pytest.mark.slow
def test_mia_logs_to_wandb_offline_when_asked(tmp_path, monkeypatch):
    run_dir = tmp_path / "mia"
    code = run_cli(hydra_main, ["method=dpsgd", *TINY, f"hydra.run.dir={run_dir}"],
                   monkeypatch, quiet=("logger=wandb", "logger.mode=offline",
                                       "trainer.progress=false", "trainer.device=cpu"))
    assert code == 0
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
