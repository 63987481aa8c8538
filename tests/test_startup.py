"""Start-up stays light: ``dpbench --help`` and ``--cfg job`` import none of the heavy optional
libraries nor the training loop (Opacus), and a digits run imports neither transformers/peft,
torchvision nor W&B with logger=none."""

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
HEAVY = ("wandb", "matplotlib", "transformers", "peft", "torchvision")
#: composing a config needs the method classes (their settings schemas), not the training loop
LOOP = ("opacus", "dpbench.training.loop")
PROBE = """
import json, runpy, sys
sys.argv = ["dpbench", *{args!r}]
try:
    runpy.run_module("dpbench", run_name="__main__")
except SystemExit:
    pass
print("MODULES=" + json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _imported(args: list[str], cwd: Path, modules: tuple[str, ...] = HEAVY + LOOP) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE.format(args=args, heavy=modules)],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    line = [x for x in out.stdout.splitlines() if x.startswith("MODULES=")]
    assert line, out.stderr[-2000:]
    return json.loads(line[-1].removeprefix("MODULES="))


@pytest.mark.parametrize("args", [["--help"], ["--cfg", "job"]])
def test_help_and_composed_config_import_no_heavy_library(args, tmp_path):
    assert _imported(args, tmp_path) == []


@pytest.mark.slow
def test_a_digits_run_imports_only_what_it_needs(tmp_path):
    imported = _imported(["logger=none", "trainer.epochs=1", "trainer.progress=false",
                          f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert "transformers" not in imported and "peft" not in imported
    assert "wandb" not in imported
    assert "torchvision" not in imported  # ResNet's builder imports it on first use
    assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "completed"
