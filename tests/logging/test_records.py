"""The run-independent fields of results.json: the environment block."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import torch

from dpbench.logging.records import environment
from tests.helpers.results_contract import ENVIRONMENT_KEYS


def test_environment_names_the_versions_device_threads_and_cpu_kernels():
    env = environment("cpu")
    assert set(ENVIRONMENT_KEYS) <= env.keys()
    assert env["torch"] == importlib.metadata.version("torch") and torch.__version__.startswith(
        env["torch"])
    assert env["opacus"] == importlib.metadata.version("opacus")
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    assert env["device"] == "cpu" and env["device_name"]
    assert env["torch_threads"] == torch.get_num_threads()
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(env["git_dirty"], bool)


def test_auto_resolves_to_the_device_the_run_would_use():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert environment("auto")["device"] == expected


def test_the_cpu_kernel_set_follows_aten_cpu_capability():
    """A run under ATEN_CPU_CAPABILITY=default says so (another machine's rounding)."""
    code = ("import json, torch; from dpbench.logging.records import environment; "
            "print(json.dumps(environment('cpu')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ,
                                          "ATEN_CPU_CAPABILITY": "default"})
    env = json.loads(out.stdout)
    assert env["cpu_capability"] == "DEFAULT" and env["aten_cpu_capability_env"] == "default"


def test_a_record_written_before_torch_is_imported_leaves_the_torch_fields_null():
    code = ("import json, sys; from dpbench.logging.records import environment; "
            "env = environment('cpu'); assert 'torch' not in sys.modules; "
            "print(json.dumps(env))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    env = json.loads(out.stdout)
    assert env["cpu_capability"] is None and env["torch"] == importlib.metadata.version("torch")
