"""Where the Hydra configuration lives, and names in it that several layers check."""

from __future__ import annotations

import os
from pathlib import Path

#: the ``conf/`` directory (``DPBENCH_CONFIG_DIR`` points elsewhere)
CONF_DIR = os.environ.get("DPBENCH_CONFIG_DIR",
                          str(Path(__file__).resolve().parents[2] / "conf"))

#: ``trainer.grad_sample_mode`` values (checked by the schema, used by the loop and the bench)
GRAD_SAMPLE_MODES = ("auto", "hooks", "functorch", "ghost", "bk")  # auto, bk: training/engines.py
