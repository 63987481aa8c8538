"""Every rejected input of the bad-input table in docs/reliability.md, through the real CLI:
exit code != 0, a message naming the problem, and nothing left in the run directory."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from dpbench.cli import hydra_main
from dpbench.methods import METHODS, method_names
from dpbench.methods.base import DPMethod
from tests.helpers.cli import run_cli
from tests.helpers.synthetic import write_mnist_copy

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

BASE = ("model.hidden=16", "trainer.epochs=1", "trainer.batch_size=64")
HYDRA = 1  # Hydra rejects an unknown config group option itself (exit 1, lists the options)
DPBENCH = 2  # dpbench's ConfigError / DataError (exit 2)

#: (row id, overrides, exit code, message fragment): docs/reliability.md, one test per row
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
    ("unknown sampler", ["trainer.sampler=nosuch"], DPBENCH,
     "trainer.sampler must be one of poisson, fixed_size, shuffle"),
    ("balls-in-bins sampler", ["trainer.sampler=balls_in_bins"], DPBENCH,
     "trainer.sampler=balls_in_bins is refused"),
    ("fixed-size sampler under PLD", ["trainer.sampler=fixed_size", "privacy.accountant=pld"],
     DPBENCH,
     "privacy.accountant=pld has no accounting for trainer.sampler=fixed_size"),
    ("shuffle under add/remove", ["trainer.sampler=shuffle", "privacy.neighbouring=add_remove"],
     DPBENCH, "privacy.neighbouring=add_remove has no valid accountant"),
    ("unknown neighbouring", ["privacy.neighbouring=nosuch"], DPBENCH,
     "privacy.neighbouring must be one of add_remove, replace_one"),
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
    code = run_cli(hydra_main, [*BASE, *overrides, f"hydra.run.dir={run_dir}"], monkeypatch)
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
    only = DPMethod("timeseries_only", tasks=frozenset({"timeseries"}))
    monkeypatch.setitem(METHODS._entries, "timeseries_only", only)
    code, output, run_dir = _run(monkeypatch, tmp_path,
                                 ["method=plugin", "method.name=timeseries_only"], capfd)
    _assert_rejected(code, output, run_dir, DPBENCH,
                     "method 'timeseries_only' does not support the 'classification' task")


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_corrupt_or_truncated_data_file(damage, monkeypatch, tmp_path, capfd):
    root = tmp_path / "data"
    write_mnist_copy(root, n=400)
    target = root / "mnist" / "t10k-images-idx3-ubyte.gz"
    if damage == "truncated":
        target.write_bytes(target.read_bytes()[:5000])
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
    assert run_cli(hydra_main, [*BASE, "trainer.epochs=2", f"hydra.run.dir={run_dir}"],
                   monkeypatch) == 0
    if not finished:  # as after a kill in epoch 2: results.json says running
        import json

        record = json.loads((run_dir / "results.json").read_text())
        record["status"] = "running"
        (run_dir / "results.json").write_text(json.dumps(record))
    before = _snapshot(run_dir)
    capfd.readouterr()
    code = run_cli(hydra_main, [*BASE, "trainer.epochs=2", "method.optimizer.lr=0.1",
                                  "trainer.resume=true", f"hydra.run.dir={run_dir}"],
                   monkeypatch)
    output = capfd.readouterr().err
    assert code == DPBENCH, output
    assert "written by another configuration" in output
    assert _snapshot(run_dir) == before


# --- settings that were silently not applied, or failed after training had begun ---------

#: (row id, overrides, message fragment): refused before training, exit 2, key named
SETTINGS_ROWS = [
    ("non-private method with a target", ["method=ivon", "privacy=eps3"],
     "method ivon is non-private; use privacy=nonprivate (got privacy=eps3, "
     "privacy.target_epsilon=3.0)"),
    ("nonprivate method with eps1", ["method=nonprivate", "privacy=eps1"],
     "method nonprivate is non-private; use privacy=nonprivate (got privacy=eps1"),
    ("sigma and target both set", ["privacy.noise_multiplier=0.5", "privacy.target_epsilon=1"],
     "privacy.noise_multiplier=0.5 and privacy.target_epsilon=1.0 are both set"),
    ("sigma over the default target", ["privacy.noise_multiplier=0.5"],
     "privacy.noise_multiplier=0.5 and privacy.target_epsilon=3.0 are both set"),
    ("target with privacy off", ["privacy=nonprivate", "privacy.target_epsilon=3"],
     "would ignore privacy.target_epsilon=3"),
    ("clip=inf", ["privacy.clip_norm=inf"], "privacy.clip_norm must be finite (got inf)"),
    ("eval_every=0", ["trainer.eval_every=0"], "trainer.eval_every must be an integer >= 1"),
    ("train_fraction=1", ["dataset.train_fraction=1.0"],
     "dataset.train_fraction must be a number in (0, 1)"),
    ("train_fraction=0", ["dataset.train_fraction=0"],
     "dataset.train_fraction must be a number in (0, 1)"),
    ("lr=nan", ["method.optimizer.lr=nan"], "method.optimizer.lr must be a finite number"),
    ("lr=0", ["method.optimizer.lr=0"], "method.optimizer.lr must be a finite number > 0"),
    ("momentum=inf", ["method.optimizer.momentum=inf"],
     "method.optimizer.momentum must be a finite number"),
    ("setting=nan", ["method=adaclip", "method.settings.clip_lr=nan"],
     "method.settings.clip_lr must be a number"),
    ("train_subset=-5", ["dataset=mnist", "paths.data_root=/nonexistent/dpbench",
                         "dataset.download=false", "dataset.train_subset=-5"],
     "dataset.train_subset must be an integer >= 1 or null (got -5)"),
    ("seed=abc", ["seed=abc"], "seed must be an integer in [0, 2**63) (got 'abc')"),
    ("seed<0", ["seed=-1"], "seed must be an integer in [0, 2**63) (got -1)"),
    ("seed=1.5", ["seed=1.5"], "seed must be an integer in [0, 2**63) (got 1.5)"),
]


def _cli(monkeypatch, capfd, *args: str) -> tuple[int, str]:
    code = run_cli(hydra_main, [*BASE, *args], monkeypatch)
    captured = capfd.readouterr()
    return code, captured.err + captured.out


def _one_line_error(output: str, fragment: str) -> None:
    errors = [line for line in output.splitlines() if line.startswith("dpbench: error:")]
    assert len(errors) == 1 and fragment in errors[0], output
    assert "Traceback" not in output and "Error executing job" not in output, output


@pytest.mark.parametrize("row", SETTINGS_ROWS, ids=[r[0] for r in SETTINGS_ROWS])
def test_setting_is_refused_before_training(row, monkeypatch, tmp_path, capfd):
    _, overrides, message = row
    (tmp_path / "keep").write_text("a file the run must not touch")
    run_dir = tmp_path / "run"
    code, output = _cli(monkeypatch, capfd, *overrides, f"hydra.run.dir={run_dir}")
    assert code == DPBENCH, output
    _one_line_error(output, message)
    assert not run_dir.exists() and (tmp_path / "keep").exists()  # it removed only its own dir


def test_cuda_on_a_machine_without_cuda(monkeypatch, tmp_path, capfd):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, output = _cli(monkeypatch, capfd, "trainer.device=cuda",
                        f"hydra.run.dir={tmp_path / 'run'}")
    assert code == DPBENCH, output
    _one_line_error(output, "trainer.device=cuda but CUDA is not available")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("method", ["nonprivate", "ivon"])
def test_a_non_private_method_selects_privacy_nonprivate(method):
    from tests.helpers.config import compose_config

    cfg = compose_config(f"method={method}")
    assert cfg.privacy.name == "nonprivate" and cfg.privacy.enabled is False
    assert cfg.privacy.target_epsilon is None and cfg.run_name.endswith("-nonprivate-s0")
    private = compose_config("method=dpsgd")  # a private method keeps the default target
    assert private.privacy.name == "eps3" and private.privacy.target_epsilon == 3.0


def test_dpbench_method_nonprivate_runs_and_records_no_target(monkeypatch, tmp_path, capfd):
    import json

    run_dir = tmp_path / "run"
    code, output = _cli(monkeypatch, capfd, "method=nonprivate", f"hydra.run.dir={run_dir}")
    assert code == 0, output
    record = json.loads((run_dir / "results.json").read_text())
    assert record["privacy"] == "nonprivate" and record["target_epsilon"] is None
    assert record["private"] is False and record["status"] == "completed"


def test_sweep_of_nonprivate_over_epsilons_fails_those_jobs_clearly(monkeypatch, tmp_path,
                                                                      capfd):
    """A method x epsilon grid with a non-private method: its jobs fail at setup (nothing
    trained), each with the one-line reason in its record; the private jobs complete."""
    import json

    sweep = tmp_path / "sweep"
    code, output = _cli(monkeypatch, capfd, "-m", "method=nonprivate,dpsgd",
                        "privacy=eps1,eps3", "privacy.accountant=rdp", "trainer.batch_size=256",
                        "trainer.checkpoint=false", f"hydra.sweep.dir={sweep}")
    assert code == 0, output
    records = [json.loads(p.read_text()) for p in sweep.rglob("results.json")]
    status = sorted((r["method_name"], r["privacy"], r["status"]) for r in records)
    assert status == [("dpsgd", "eps1", "completed"), ("dpsgd", "eps3", "completed"),
                      ("nonprivate", "eps1", "failed"), ("nonprivate", "eps3", "failed")]
    for r in records:
        if r["status"] == "failed":
            assert "use privacy=nonprivate" in r["error"] and r["failed_stage"] == "setup"
    assert output.count("method nonprivate is non-private") == 2


# --- messages say what happened --------------------------------------------------------------

def test_failed_download_is_not_reported_as_download_off(monkeypatch, tmp_path, capfd):
    from torchvision.datasets import MNIST

    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])  # refused at once, offline
    code, output = _cli(monkeypatch, capfd, "dataset=mnist", f"paths.data_root={tmp_path}/d",
                        "dataset.download=true", f"hydra.run.dir={tmp_path / 'run'}")
    assert code == DPBENCH, output
    _one_line_error(output, "the download failed")
    assert "download is off" not in output


def test_permission_error_is_not_reported_as_corrupt(monkeypatch, tmp_path, capfd):
    import errno

    root = tmp_path / "data"
    (root / "mnist").mkdir(parents=True)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (root / "mnist" / name).write_bytes(gzip.compress(b"\x00" * 16))

    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(gzip, "open", denied)
    code, output = _cli(monkeypatch, capfd, "dataset=mnist", f"paths.data_root={root}",
                        "dataset.download=false", f"hydra.run.dir={tmp_path / 'run'}")
    assert code == DPBENCH, output
    _one_line_error(output, "permission denied")
    assert "corrupt" not in output


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_unreadable_checkpoint_is_one_line(damage, monkeypatch, tmp_path, capfd):
    import io

    import torch

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    buffer = io.BytesIO()
    torch.save({"epoch": 1, "model": {"w": torch.zeros(100, 100)}}, buffer)
    ckpt = run_dir / "checkpoint.pt"  # as after a kill mid-copy, or a stray file
    ckpt.write_bytes(buffer.getvalue()[:2000] if damage == "truncated" else b"not a checkpoint")
    from dpbench.utils.mac import write_mac

    write_mac(ckpt, ckpt.read_bytes())  # the user's own file (a planted one has no MAC)
    before = _snapshot(run_dir)
    code, output = _cli(monkeypatch, capfd, "trainer.resume=true", "privacy=nonprivate",
                        f"hydra.run.dir={run_dir}")
    assert code == DPBENCH, output
    _one_line_error(output, f"the checkpoint {ckpt} is corrupt or truncated")
    assert _snapshot(run_dir) == before


# --- runs and files ----------------------------------------------------------------------------

def _hold_lock_in_another_process(run_dir: Path):
    """Start a process that holds ``run_dir``'s lock; return it once it holds it."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    code = ("import sys, time; from dpbench.utils.lock import RunDirLock; "
            f"RunDirLock({str(run_dir)!r}).acquire(); print('held', flush=True); "
            "time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=repo, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(repo)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_run_on_a_locked_run_dir_is_refused(monkeypatch, tmp_path, capfd):
    from dpbench.utils.lock import RunDirLock

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text('{"status": "running"}')  # the first run's
    holder = _hold_lock_in_another_process(run_dir)
    try:
        code, output = _cli(monkeypatch, capfd, f"hydra.run.dir={run_dir}")
        assert code == DPBENCH, output
        _one_line_error(output, f"{run_dir} is in use by another dpbench run (pid {holder.pid})")
        assert (run_dir / "results.json").read_text() == '{"status": "running"}'
        assert sorted(p.name for p in run_dir.iterdir()) == [".dpbench.lock", "results.json"]
    finally:
        holder.kill()  # as a crash: the lock file stays behind, its holder is gone
        holder.wait()
    assert (run_dir / ".dpbench.lock").exists()
    with RunDirLock(run_dir):  # a stale lock of a dead process does not block the next run
        pass
    assert not (run_dir / ".dpbench.lock").exists()


def test_run_dir_lock_is_exclusive_and_removed_on_release(tmp_path):
    from dpbench.utils.lock import RunDirBusy, RunDirLock

    with RunDirLock(tmp_path):
        with pytest.raises(RunDirBusy, match="in use by another dpbench run"):
            RunDirLock(tmp_path).acquire()
    assert list(tmp_path.iterdir()) == []
    with RunDirLock(tmp_path):  # free again
        pass


@pytest.mark.parametrize("layout", ["empty parents", "empty run dir"])
def test_refused_run_keeps_folders_it_did_not_create(layout, monkeypatch, tmp_path, capfd):
    mine = tmp_path / "mine"  # the user's own, empty folder
    mine.mkdir()
    run_dir = mine / "a" / "b" if layout == "empty parents" else mine
    code, output = _cli(monkeypatch, capfd, "trainer.epochs=0", f"hydra.run.dir={run_dir}")
    assert code == DPBENCH, output
    assert mine.is_dir() and list(mine.iterdir()) == []  # its own a/b removed, mine kept


def test_run_dir_under_a_file_is_one_line(monkeypatch, tmp_path, capfd):
    (tmp_path / "file.txt").write_text("x")
    code, output = _cli(monkeypatch, capfd, f"hydra.run.dir={tmp_path / 'file.txt' / 'run'}")
    assert code == DPBENCH, output
    _one_line_error(output, "cannot create hydra.run.dir=")
    assert "Not a directory" in output and (tmp_path / "file.txt").read_text() == "x"


def _refuse_writes_under(monkeypatch, folder: Path, err: int, *, only: str = "") -> None:
    """Make mkdir/open under ``folder`` fail with ``err`` (a read-only or full file system;
    tests run as root, whom chmod does not stop)."""
    import builtins
    import errno
    import os

    real_mkdir, real_open, real_builtin_open = os.mkdir, os.open, builtins.open

    def blocked(path) -> bool:
        text = os.path.abspath(os.fspath(path))
        return text.startswith(str(folder)) and only in os.path.basename(text)

    def mkdir(path, *args, **kwargs):
        if blocked(path):
            raise OSError(err, os.strerror(err), str(path))
        return real_mkdir(path, *args, **kwargs)

    def open_(path, flags, *args, **kwargs):
        if blocked(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(err, os.strerror(err), str(path))
        return real_open(path, flags, *args, **kwargs)

    def builtin_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and blocked(file) and set(mode) & set("wax+"):
            raise OSError(err, os.strerror(err), str(file))
        return real_builtin_open(file, mode, *args, **kwargs)

    assert errno.errorcode[err]
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(builtins, "open", builtin_open)


@pytest.mark.parametrize("exists", [False, True], ids=["new run dir", "existing run dir"])
def test_read_only_output_folder_is_one_line(exists, monkeypatch, tmp_path, capfd):
    import errno

    run_dir = tmp_path / "ro" / "run"
    if exists:
        run_dir.mkdir(parents=True)
    _refuse_writes_under(monkeypatch, tmp_path / "ro", errno.EROFS)
    code, output = _cli(monkeypatch, capfd, f"hydra.run.dir={run_dir}")
    assert code == DPBENCH, output
    _one_line_error(output, "Read-only file system")
    assert str(tmp_path / "ro") in output


def test_disk_full_during_training_is_one_line(monkeypatch, tmp_path, capfd):
    import errno

    run_dir = tmp_path / "run"
    _refuse_writes_under(monkeypatch, run_dir, errno.ENOSPC, only="results.json")
    code, output = _cli(monkeypatch, capfd, "trainer.epochs=2", "privacy=nonprivate",
                        "trainer.batch_size=256", f"hydra.run.dir={run_dir}")
    assert code == 1, output  # training had begun: exit 1, the reason in one line
    _one_line_error(output, "No space left on device")
    assert not (run_dir / "results.json").exists()
