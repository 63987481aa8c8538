"""The command-line guard composes exactly the jobs Hydra will run, with every sweep syntax
Hydra documents, and no config may set dpbench's environment (the MAC key is the user's)
(docs/reliability-bad-input.md, "What Hydra runs")."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpbench.config.hydra_guard import check_hydra_command
from dpbench.errors import ConfigError
from dpbench.utils.conf import CONF_DIR

REPO = Path(__file__).resolve().parents[1]
FACTORY = "hydra.job_logging.filters.f.()='pandas.read_pickle' is not an allowed factory"


def _shared(tmp_path: Path) -> tuple[Path, Path]:
    """A colleague's config folder: ``experiment/acb.yaml`` (harmless) and ``alog.yaml``
    (a logging factory that unpickles a file); returns (folder, the payload's marker)."""
    marker = tmp_path / "payload-ran"
    folder = tmp_path / "shared"
    (folder / "experiment").mkdir(parents=True)
    (folder / "experiment" / "acb.yaml").write_text("# @package _global_\nseed: 3\n")
    (folder / "experiment" / "alog.yaml").write_text(textwrap.dedent(f"""\
        # @package _global_
        hydra:
          job_logging:
            filters:
              f: {{"()": pandas.read_pickle, filepath_or_buffer: {marker}}}
        """))
    (folder / "experiment" / "sweeps.yaml").write_text(textwrap.dedent("""\
        # @package _global_
        hydra:
          sweeper:
            params:
              +extra: glob(*)
        """))
    (folder / "extra").mkdir()  # a group the sweeper's params sweep
    (folder / "extra" / "alog.yaml").write_text(
        (folder / "experiment" / "alog.yaml").read_text())
    return folder, marker


# every sweep syntax of Hydra's override grammar that lists the hostile option; each is
# refused by the guard (before, glob(...) was dropped and group sweeps never composed)
SWEEPS = [
    ["-m", "experiment=glob(a*)"],
    ["-m", "experiment=glob(*,exclude=acb)"],
    ["-m", "experiment=choice(acb,alog)"],
    ["-m", "experiment=acb,alog"],
    ["-m", "experiment=sort(alog,acb)"],
    ["-m", "experiment=shuffle(acb,alog)"],
    ["-m", "experiment=tag(x,choice(acb,alog))"],
    ["-m", "seed=range(0,2)", "experiment=acb,alog"],
    ["hydra.mode=MULTIRUN", "experiment=glob(a*)"],
    ["-m", "experiment=sweeps"],  # the sweeper's own params, set by a config file
]


@pytest.mark.parametrize("args", SWEEPS, ids=lambda a: " ".join(a))
def test_every_sweep_syntax_composes_the_hostile_option(tmp_path, args):
    shared, marker = _shared(tmp_path)
    with pytest.raises(ConfigError) as err:
        check_hydra_command(["--config-dir", str(shared), *args], CONF_DIR, "config",
                            "dpbench.cli")
    assert str(err.value).startswith(FACTORY)
    assert not marker.exists()


def test_a_swept_plain_value_reaching_the_logging_config_is_checked_per_job(tmp_path):
    """Jobs that differ only in plain values are composed once, unless a checked value
    interpolates: then every job is (here only the second value names a file handler)."""
    folder = tmp_path / "shared"
    (folder / "experiment").mkdir(parents=True)
    (folder / "experiment" / "interp.yaml").write_text(textwrap.dedent("""\
        # @package _global_
        handler_class: logging.StreamHandler
        hydra:
          job_logging:
            handlers:
              h: {class: "${handler_class}"}
        """))
    with pytest.raises(ConfigError, match=r"hydra.job_logging.handlers.h.class="):
        check_hydra_command(["--config-dir", str(folder), "-m", "experiment=interp",
                             "handler_class=logging.StreamHandler,logging.FileHandler"],
                            CONF_DIR, "config", "dpbench.cli")


def test_a_sweep_the_guard_cannot_list_is_refused(tmp_path):
    """``interval(...)`` only a search sweeper lists: refused, never left unchecked."""
    with pytest.raises(ConfigError, match="the sweep cannot be listed"):
        check_hydra_command(["-m", "trainer.lr=interval(0.1,1)"], CONF_DIR, "config",
                            "dpbench.cli")


def test_harmless_sweeps_pass(tmp_path):
    shared, _ = _shared(tmp_path)
    check_hydra_command(["--config-dir", str(shared), "-m", "experiment=glob(ac*)",
                         "seed=range(0,3)"], CONF_DIR, "config", "dpbench.cli")


@pytest.mark.parametrize(("override", "key"), [
    ("+hydra.job.env_set.DPBENCH_MAC_KEY=known-to-everyone-0123", "DPBENCH_MAC_KEY"),
    ("+hydra.job.env_set.DPBENCH_MAC_KEY_FILE=/srv/known.key", "DPBENCH_MAC_KEY_FILE"),
    ("+hydra.job.env_set.XDG_CONFIG_HOME=/srv/known", "XDG_CONFIG_HOME"),
    ("+hydra.job.env_set.HOME=/srv/known", "HOME"),
])
def test_a_config_never_sets_the_mac_key(override, key):
    with pytest.raises(ConfigError) as err:
        check_hydra_command([override], CONF_DIR, "config", "dpbench.cli")
    assert str(err.value).startswith(f"hydra.job.env_set.{key} is refused")


def test_a_launcher_line_naming_the_key_is_refused():
    with pytest.raises(ConfigError, match=r"hydra.launcher.setup\[0\]=.*is refused"):
        check_hydra_command(["-m", "hydra/launcher=submitit_slurm",
                             "hydra.launcher.setup=['export DPBENCH_MAC_KEY=x']", "seed=0"],
                            CONF_DIR, "config", "dpbench.cli")


def test_an_unknown_sweeper_or_launcher_is_refused():
    for key in ("hydra.sweeper._target_", "hydra.launcher._target_"):
        with pytest.raises(ConfigError, match=f"{key}='antigravity.X' is refused"):
            check_hydra_command(["-m", f"{key}=antigravity.X", "seed=0"], CONF_DIR, "config",
                                "dpbench.cli")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


def _stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.mark.processes
def test_a_glob_sweep_with_a_hostile_option_never_runs_in_a_fresh_process(tmp_path):
    shared, marker = _shared(tmp_path)
    marker.write_bytes(b"not a pickle")  # read_pickle would try it
    proc = subprocess.run([sys.executable, "-m", "dpbench", "-m", "--config-dir", str(shared),
                           "experiment=glob(a*)", "trainer.epochs=1"], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=300)
    lines = _stderr_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(f"dpbench: error: {FACTORY}")
    assert not (tmp_path / "multirun").exists()


@pytest.mark.processes
@pytest.mark.parametrize(("env", "message"), [
    ({"DPBENCH_MAC_KEY": "short"}, "DPBENCH_MAC_KEY is 5 characters long, shorter than the 16"),
    ({"DPBENCH_MAC_KEY_FILE": "FIFO"}, "the MAC key FIFO is not a regular file"),
    ({"XDG_CONFIG_HOME": "AFILE/config"}, "XDG_CONFIG_HOME: cannot create the folder of the "
                                         "MAC key AFILE/config/dpbench (Not a directory)"),
], ids=["short-key", "fifo-key-file", "xdg-not-creatable"])
def test_an_unusable_mac_key_is_refused_before_training(tmp_path, env, message):
    """One line naming the cause, exit 2, no run folder: before, a FIFO key hung the run at
    its first MAC, and an XDG_CONFIG_HOME that cannot be created failed after training."""
    fifo, afile = tmp_path / "key.fifo", tmp_path / "afile"
    os.mkfifo(fifo)
    afile.write_text("")
    env = {k: v.replace("FIFO", str(fifo)).replace("AFILE", str(afile)) for k, v in env.items()}
    message = message.replace("FIFO", str(fifo)).replace("AFILE", str(afile))
    base = _env(**env)
    if "DPBENCH_MAC_KEY_FILE" not in env:
        base.pop("DPBENCH_MAC_KEY_FILE", None)
    proc = subprocess.run([sys.executable, "-m", "dpbench", "trainer.epochs=1"], cwd=tmp_path,
                          env=base, capture_output=True, text=True, timeout=120)
    lines = _stderr_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert message in lines[0], lines
    assert not (tmp_path / "outputs").exists()


@pytest.mark.processes
def test_the_key_read_at_start_up_signs_even_if_the_environment_changes_later(tmp_path):
    """``freeze_key``: what a job's environment says after start-up never picks the key."""
    code = textwrap.dedent("""
        import os, sys
        from dpbench.utils.mac import freeze_key, mac_key
        first = freeze_key()
        os.environ["DPBENCH_MAC_KEY"] = "known-to-everyone-0123456789"
        sys.exit(0 if mac_key() == first != b"known-to-everyone-0123456789" else 1)
        """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.processes
def test_dpbench_tune_reads_the_key_before_any_trial(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dpbench.tune.cli", "--lrs", "0.1", "--seeds",
                           "0", "--out", str(tmp_path / "out"), "--", "trainer.epochs=1"],
                          cwd=tmp_path, env=_env(DPBENCH_MAC_KEY="short"), capture_output=True,
                          text=True, timeout=120)
    lines = _stderr_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("dpbench-tune: error: DPBENCH_MAC_KEY is 5 characters long")
    assert not (tmp_path / "out").exists()


@pytest.mark.processes
@pytest.mark.parametrize(("swept", "named"), [
    ("trainer.epochs=1,abc", "trainer.epochs"),        # cannot be composed (typed field)
    ("method=dpsgd,nope", "method/nope"),              # no such option
])
def test_a_job_that_cannot_be_composed_refuses_the_sweep_in_one_line(tmp_path, swept, named):
    """Every job of a sweep is composed before the first one trains: a value Hydra cannot
    compose in job 2 refuses the sweep in one line naming the key, exit 2; the folder this
    command created (and Hydra's multirun.yaml) goes again, and a folder the user had keeps
    what it held. (A value dpbench's own checks refuse fails that job alone, at its start:
    docs/reliability-bad-input.md, "Sweeps".)"""
    fresh = tmp_path / "fresh" / "sweep"
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    for sweep_dir in (fresh, kept):
        epochs = [] if swept.startswith("trainer.epochs") else ["trainer.epochs=1"]
        proc = subprocess.run([sys.executable, "-m", "dpbench", "-m", swept, *epochs,
                               "logger=none", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path,
                              env=_env(), capture_output=True, text=True, timeout=300)
        lines = _stderr_lines(proc)
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
        assert lines[0].startswith("dpbench: error: a job of the sweep cannot be composed: ")
        assert named in lines[0]
        assert "epoch" not in proc.stdout  # no job trained
    assert not (tmp_path / "fresh").exists()
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]
