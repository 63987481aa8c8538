"""Shared fixtures (the shared helpers live in tests/helpers/): the real data root, offline W&B."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# absl (under dp-accounting) makes a log handler bound to the sys.stderr of the moment; when
# Hydra's logging config later shuts all handlers down, absl closes that stream unless it is the
# *current* sys.stderr, i.e. it closes pytest's capture file ("lost sys.stderr"). Bind it to the
# real stderr, which absl never closes. absl.logging alone makes the handler: importing it, not
# dp-accounting (seconds of scipy), keeps collection and narrow runs short.
try:
    from absl import logging as _absl_logging

    _absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__
except ImportError:  # the dev extra is absent
    pass

import torch

from dpbench.config.entry import prepare_hydra
from dpbench.utils.mac import thaw_key

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:  # pytest-xdist: the workers share the cores, one torch pool each
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


#: every test composes as the console scripts do, whatever it imported first (the launchers
#: themselves are tested from a fresh process: tests/test_console_scripts.py)
prepare_hydra()


def pytest_collection_modifyitems(config, items):
    """Hand out the long tests first (whole runs, then the privacy matrix): xdist's workers then
    fill their tails with short ones instead of one worker finishing a long run alone. Only the
    schedule changes; every test is independent of the order (docs/testing.md)."""
    def tier(item) -> int:
        return (0 if item.get_closest_marker("integration")
                else 1 if item.get_closest_marker("privacy_matrix") else 2)

    items.sort(key=tier)  # stable: a module's tests keep their order within a tier


@pytest.fixture(autouse=True, scope="session")
def mac_key_file(tmp_path_factory) -> Path:
    """Point dpbench's MAC key at a tmp file (0600) for the whole session, subprocesses
    included: the tests never create or read a key under the real home."""
    path = tmp_path_factory.mktemp("dpbench-key") / "mac.key"
    path.write_text("0123456789abcdef" * 4 + "\n")
    path.chmod(0o600)
    saved = {k: os.environ.pop(k, None) for k in ("DPBENCH_MAC_KEY", "DPBENCH_MAC_KEY_FILE")}
    os.environ["DPBENCH_MAC_KEY_FILE"] = str(path)
    yield path
    for key, value in saved.items():
        os.environ.pop(key, None)
        if value is not None:
            os.environ[key] = value


@pytest.fixture
def data_root() -> Path:
    """Return the real data root of ``@pytest.mark.data`` tests (``DPBENCH_DATA_ROOT``).

    Fails, never skips, when it is unset or missing: ``make test-data`` was asked to check the
    real files, so their absence is an error.
    """
    value = os.environ.get("DPBENCH_DATA_ROOT", "")
    if not value:
        pytest.fail("DPBENCH_DATA_ROOT is not set: the `data` tests check the real data files "
                    "and need it (e.g. DPBENCH_DATA_ROOT=/path/to/data make test-data)",
                    pytrace=False)
    root = Path(value).expanduser().resolve()
    if not root.is_dir():
        pytest.fail(f"DPBENCH_DATA_ROOT={value} is not a folder", pytrace=False)
    return root


@pytest.fixture(autouse=True)
def _offline_wandb(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


@pytest.fixture(autouse=True)
def _process_state_restored():
    """Leave the process as the test found it, whatever order or worker runs the next one.

    Code under test may set environment variables (e.g. ``HF_HUB_OFFLINE``) or torch's thread
    count (a sweep job's share of the cores), or freeze the MAC key (an in-process console
    script's start); a later test must not inherit them.
    """
    environ, threads, cwd = dict(os.environ), torch.get_num_threads(), os.getcwd()
    yield
    thaw_key()
    if dict(os.environ) != environ:
        os.environ.clear()
        os.environ.update(environ)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if os.getcwd() != cwd:
        os.chdir(cwd)
