"""Shared fixtures (the shared helpers live in tests/helpers/): the real data root, offline W&B."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
