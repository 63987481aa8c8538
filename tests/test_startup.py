"""Start-up stays light: ``dpbench --help`` and ``--cfg job`` import none of the heavy optional
libraries, the statistics and plotting libraries (scipy, pandas, matplotlib) nor the training
loop (Opacus), a digits run imports neither transformers/peft, torchvision nor W&B with
logger=none, and a sweep of K seeds composes its configuration K times plus a fixed few."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# what a fresh interpreter imports: make test-processes (docs/testing.md)
pytestmark = [pytest.mark.integration, pytest.mark.processes]

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("wandb", "matplotlib", "transformers", "peft", "torchvision", "scipy", "pandas",
         "sklearn")
#: composing a config needs the methods' settings dataclasses (dpbench.method_settings), not
#: the methods, torch or the training loop
LOOP = ("torch", "opacus", "dpbench.training.loop", "dpbench.methods")
PROBE = """
import json, runpy, sys
sys.argv = ["dpbench", *{args!r}]
try:
    runpy.run_module({module!r}, run_name="__main__")
except SystemExit:
    pass
print("MODULES=" + json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _imported(args: list[str], cwd: Path, modules: tuple[str, ...] = HEAVY + LOOP,
              module: str = "dpbench") -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE.format(args=args, heavy=modules,
                                                             module=module)],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    line = [x for x in out.stdout.splitlines() if x.startswith("MODULES=")]
    assert line, out.stderr[-2000:]
    return json.loads(line[-1].removeprefix("MODULES="))


@pytest.mark.parametrize("args", [["--help"], ["--cfg", "job"]])
def test_help_and_composed_config_import_no_heavy_library(args, tmp_path):
    assert _imported(args, tmp_path) == []


@pytest.mark.parametrize("module", ["dpbench.audit", "dpbench.audit.mia"])
def test_the_audits_help_imports_no_heavy_library(module, tmp_path):
    """``dpbench-audit --help`` and ``dpbench-mia --help`` compose their config and print:
    no training loop, torch, Opacus or scipy."""
    assert _imported(["--help"], tmp_path, module=module) == []


@pytest.mark.parametrize("module", ["dpbench.bench", "dpbench.runners.reproduce"])
def test_the_bench_and_reproduce_help_import_no_heavy_library(module, tmp_path):
    """``dpbench-bench --help`` and ``dpbench-reproduce --help`` parse their arguments before
    importing torch (the timed steps) or scipy and pandas (the claims and the design)."""
    assert _imported(["--help"], tmp_path, modules=HEAVY + LOOP + (
        "dpbench.bench_steps", "dpbench.analysis.claims", "dpbench.runners.adaptive"),
                     module=module) == []


@pytest.mark.parametrize("module", ["dpbench.analysis.report", "dpbench.tune.cli"])
def test_the_readers_and_tunings_help_import_no_heavy_library(module, tmp_path):
    """``dpbench-report --help`` and ``dpbench-tune --help`` parse their arguments before
    importing pandas, scipy or torch."""
    assert _imported(["--help"], tmp_path, modules=HEAVY + ("torch", "opacus"),
                     module=module) == []


@pytest.mark.slow
def test_a_digits_run_imports_only_what_it_needs(tmp_path):
    imported = _imported(["logger=none", "trainer.epochs=1", "trainer.progress=false",
                          f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert "transformers" not in imported and "peft" not in imported
    assert "wandb" not in imported
    assert "torchvision" not in imported  # ResNet's builder imports it on first use
    assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "completed"


def test_the_import_floor_is_what_a_run_imports(tmp_path):
    """``bench_startup``'s floor imports only libraries a demo run imports too, so it never
    overstates what a first step or a sweep must pay."""
    from dpbench.bench_startup import FLOOR_MODULES

    imported = _imported(["logger=none", "trainer.epochs=1", "trainer.progress=false",
                          f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                         modules=FLOOR_MODULES)
    assert imported == sorted(FLOOR_MODULES)


#: counts Hydra's compositions (``load_configuration``) in a fresh ``dpbench`` process
COUNT_PROBE = """
import runpy, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
calls = []
compose = ConfigLoaderImpl.load_configuration
def counted(self, *args, **kwargs):
    calls.append(1)
    return compose(self, *args, **kwargs)
ConfigLoaderImpl.load_configuration = counted
sys.argv = ["dpbench", *{args!r}]
try:
    runpy.run_module("dpbench", run_name="__main__")
except SystemExit as stop:
    print("EXIT=" + str(stop.code))
print("COMPOSES=" + str(len(calls)))
"""
#: compositions a sweep makes besides one per job: the guard's (the sweep's own and one job
#: of each class of jobs, ``hydra_guard``), and Hydra's (its run mode, the sweep's config)
FIXED_COMPOSES = 4


def _composes(args: list[str], cwd: Path) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("DPBENCH_DATA_ROOT", None)
    out = subprocess.run([sys.executable, "-c", COUNT_PROBE.format(args=args)], cwd=cwd,
                         env=env, capture_output=True, text=True, timeout=600)
    line = [x for x in out.stdout.splitlines() if x.startswith("COMPOSES=")]
    assert line and "EXIT=" not in out.stdout, out.stderr[-2000:]
    return int(line[-1].removeprefix("COMPOSES="))


def test_a_sweep_of_k_seeds_composes_each_job_once(tmp_path):
    """Hydra's basic sweeper composes every job twice (to validate the batch, then to run
    it); dpbench's sweeper runs the validated composition, so 3 jobs cost 3 + a fixed few."""
    sweep = tmp_path / "sweep"
    args = ["-m", "seed=0,1,2", "logger=none", "trainer.epochs=1", "trainer.progress=false",
            f"hydra.sweep.dir={sweep}"]
    assert _composes(args, tmp_path) == 3 + FIXED_COMPOSES
    records = sorted(sweep.glob("*/results.json"))
    assert [json.loads(r.read_text())["status"] for r in records] == ["completed"] * 3
    seeds = [json.loads(r.read_text())["config"]["seed"] for r in records]
    assert seeds == [0, 1, 2]  # each job ran its own composition


def test_the_settings_schemas_import_no_torch(tmp_path):
    """Composing registers every method's settings dataclass: ``dpbench.method_settings``
    holds them apart from the methods' training code."""
    probe = ("import sys; from dpbench.method_settings import SETTINGS; "
             "assert len(SETTINGS.builtin_names()) > 10; print('TORCH=' + str('torch' in "
             "sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert "TORCH=False" in out.stdout, out.stderr[-2000:]


def _printed(command: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("DPBENCH_DATA_ROOT", None)
    out = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.parametrize("module,args", [
    ("dpbench", ["--help"]), ("dpbench", ["method=fiber", "-h", "--resolve"]),
    ("dpbench.audit", ["--help"]), ("dpbench.audit.mia", ["--help"])])
def test_help_prints_hydras_page(module, args, tmp_path):
    """``--help`` lists the config groups from one repository (``config.help``); with any
    other flag beside it (``--config-name``) Hydra prints its own page: the two are equal."""
    config = {"dpbench": "config", "dpbench.audit": "audit", "dpbench.audit.mia": "mia"}[module]
    ours = _printed([sys.executable, "-m", module, *args], tmp_path)
    hydras = _printed([sys.executable, "-m", module, *args, f"--config-name={config}"],
                      tmp_path)
    assert "Config groups" in ours and "method: " in ours
    assert ours == hydras
