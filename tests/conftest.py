"""Shared fixtures: compose configs the way the CLI does, on CPU, tiny, into tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

try:
    # absl (under dp-accounting) makes a log handler bound to the sys.stderr of the moment; when
    # Hydra's logging config later shuts all handlers down, absl closes that stream unless it is
    # the *current* sys.stderr, i.e. it closes pytest's capture file ("lost sys.stderr"). Bind it
    # to the real stderr, which absl never closes.
    import sys as _sys

    import dp_accounting  # noqa: F401
    from absl import logging as _absl_logging

    _absl_logging.get_absl_handler().python_handler.stream = _sys.__stderr__
except ImportError:  # the dev extra is absent
    pass

from dpbench.config.entry import prepare_hydra
from dpbench.utils.conf import CONF_DIR

REPO = Path(__file__).resolve().parents[1]
QUIET = ["logger=none", "trainer.progress=false", "trainer.device=cpu"]


#: every test composes as the console scripts do, whatever it imported first (the launchers
#: themselves are tested from a fresh process: tests/test_console_scripts.py)
prepare_hydra()


def compose_config(*overrides: str):
    """Return the composed config for ``overrides`` (quiet, CPU) like ``dpbench`` would."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=[*QUIET, *overrides])


def run_config(cfg, run_dir: Path | None = None) -> dict:
    """Build and fit a trainer for ``cfg``; return its summary."""
    from dpbench.experiment import build_trainer

    return build_trainer(cfg, run_dir).fit()


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
