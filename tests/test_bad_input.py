"""Every rejected input of README's "Bad input" table, through the real CLI: exit code != 0,
a message naming the problem, and nothing left in the run directory."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from dpbench.cli import _hydra_entry
from dpbench.methods import METHODS, method_names
from dpbench.methods.base import DPMethod
from tests.cli_helpers import run_cli

BASE = ("model.hidden=16", "trainer.epochs=1", "trainer.batch_size=64")
HYDRA = 1  # Hydra rejects an unknown config group option itself (exit 1, lists the options)
DPBENCH = 2  # dpbench's ConfigError / DataError (exit 2)

#: (row id, overrides, exit code, message fragment) -- README "Bad input", one test each
ROWS = [
    ("epsilon<=0", ["privacy.target_epsilon=0"], DPBENCH,
     "privacy.target_epsilon must be a number > 0"),
    ("epsilon<0", ["privacy.target_epsilon=-1"], DPBENCH,
     "privacy.target_epsilon must be a number > 0"),
    ("epsilon=nan", ["privacy.target_epsilon=nan"], DPBENCH,
     "privacy.target_epsilon must be a number > 0"),
    ("epsilon=inf", ["privacy.target_epsilon=inf"], DPBENCH,
     "privacy.target_epsilon must be finite"),
    ("delta>=1/N", ["privacy.delta=0.001"], DPBENCH, "privacy.delta must be < 1/N"),
    ("delta>=1", ["privacy.delta=1.5"], DPBENCH, "privacy.delta must be in (0, 1/N)"),
    ("clip<=0", ["privacy.clip_norm=0"], DPBENCH, "privacy.clip_norm must be a number > 0"),
    ("clip<0", ["privacy.clip_norm=-1"], DPBENCH, "privacy.clip_norm must be a number > 0"),
    ("sigma<=0", ["privacy=sigma", "privacy.noise_multiplier=0"], DPBENCH,
     "privacy.noise_multiplier must be a number > 0"),
    ("batch>N", ["trainer.batch_size=5000"], DPBENCH, "trainer.batch_size must be <= N"),
    ("epochs<1", ["trainer.epochs=0"], DPBENCH, "trainer.epochs must be an integer >= 1"),
    ("unknown method group", ["method=nosuch"], HYDRA, "Could not find 'method/nosuch'"),
    ("unknown method name", ["method=plugin", "method.name=nosuch"], DPBENCH,
     "unknown method 'nosuch'; registered:"),
    ("unknown method setting", ["+method.settings.nosuch=1"], DPBENCH,
     "has no setting(s) ['nosuch']"),
    ("unknown dataset group", ["dataset=nosuch"], HYDRA, "Could not find 'dataset/nosuch'"),
    ("unknown dataset name", ["dataset.name=nosuch"], DPBENCH, "unknown dataset 'nosuch'"),
    ("unknown model group", ["model=nosuch"], HYDRA, "Could not find 'model/nosuch'"),
    ("unknown model name", ["model.name=nosuch"], DPBENCH, "unknown model 'nosuch'"),
    ("unknown accountant", ["privacy.accountant=nosuch"], DPBENCH,
     "privacy.accountant must be one of pld, prv, rdp"),
    ("unknown grad-sample mode", ["trainer.grad_sample_mode=nosuch"], DPBENCH,
     "trainer.grad_sample_mode must be one of"),
    ("unknown nonfinite policy", ["trainer.nonfinite=nosuch"], DPBENCH,
     "trainer.nonfinite must be stop or skip"),
    ("missing data root offline", ["dataset=mnist", "paths.data_root=/nonexistent/dpbench",
                                   "dataset.download=false"], DPBENCH,
     "MNIST not found under /nonexistent/dpbench and download is off"),
]


def _run(monkeypatch, tmp_path, overrides, capfd):
    run_dir = tmp_path / "run"
    code = run_cli(_hydra_entry, [*BASE, *overrides, f"hydra.run.dir={run_dir}"], monkeypatch)
    captured = capfd.readouterr()
    return code, captured.err + captured.out, run_dir


def _assert_rejected(code, output, run_dir, expected_code, message):
    assert code == expected_code, output
    assert message in output, output
    assert not run_dir.exists() or not any(run_dir.iterdir()), "partial output left behind"
    assert "Traceback" not in output


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_is_rejected_before_training(row, monkeypatch, tmp_path, capfd):
    _, overrides, expected_code, message = row
    code, output, run_dir = _run(monkeypatch, tmp_path, overrides, capfd)
    _assert_rejected(code, output, run_dir, expected_code, message)


def test_adaptive_clipping_needs_sigma_below_twice_sigma_b(monkeypatch, tmp_path, capfd):
    if "adaclip" not in method_names():
        pytest.skip("adaclip is not registered in this checkout")
    code, output, run_dir = _run(monkeypatch, tmp_path,
                                 ["method=adaclip", "method.settings.sigma_b=0.1"], capfd)
    _assert_rejected(code, output, run_dir, DPBENCH, "sigma < 2 sigma_b")


def test_method_on_a_task_it_does_not_support(monkeypatch, tmp_path, capfd):
    class TimeSeriesOnly(DPMethod):
        name = "timeseries_only"
        tasks = frozenset({"timeseries"})

    monkeypatch.setitem(METHODS._entries, "timeseries_only", TimeSeriesOnly)
    code, output, run_dir = _run(monkeypatch, tmp_path,
                                 ["method=plugin", "method.name=timeseries_only"], capfd)
    _assert_rejected(code, output, run_dir, DPBENCH,
                     "method 'timeseries_only' does not support the 'classification' task")


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_corrupt_or_truncated_data_file(damage, shared_data, monkeypatch, tmp_path, capfd):
    root = tmp_path / "data"
    (root / "mnist").mkdir(parents=True)
    images = shared_data / "mnist" / "t10k-images-idx3-ubyte.gz"
    labels = shared_data / "mnist" / "t10k-labels-idx1-ubyte.gz"
    shutil.copy(labels, root / "mnist" / labels.name)
    target = root / "mnist" / images.name
    if damage == "truncated":
        target.write_bytes(images.read_bytes()[:5000])
    else:
        target.write_bytes(gzip.compress(b"\x00\x00\x08\x03 not an idx file"))
    code, output, run_dir = _run(monkeypatch, tmp_path, [
        "dataset=mnist", f"paths.data_root={root}", "dataset.download=false"], capfd)
    _assert_rejected(code, output, run_dir, DPBENCH, "is corrupt or truncated")
    assert str(target) in output


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}


@pytest.mark.parametrize("finished", [False, True], ids=["interrupted", "completed"])
def test_checkpoint_from_another_config_on_resume(finished, monkeypatch, tmp_path, capfd):
    """A run dir written by one config refuses a resume under another, and stays untouched."""
    run_dir = tmp_path / "run"
    assert run_cli(_hydra_entry, [*BASE, "trainer.epochs=2", f"hydra.run.dir={run_dir}"],
                   monkeypatch) == 0
    if not finished:  # as after a kill in epoch 2: results.json says running
        import json

        record = json.loads((run_dir / "results.json").read_text())
        record["status"] = "running"
        (run_dir / "results.json").write_text(json.dumps(record))
    before = _snapshot(run_dir)
    capfd.readouterr()
    code = run_cli(_hydra_entry, [*BASE, "trainer.epochs=2", "method.optimizer.lr=0.1",
                                  "trainer.resume=true", f"hydra.run.dir={run_dir}"],
                   monkeypatch)
    output = capfd.readouterr().err
    assert code == DPBENCH, output
    assert "written by another configuration" in output
    assert _snapshot(run_dir) == before
