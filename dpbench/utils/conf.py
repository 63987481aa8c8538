"""Where the Hydra configuration lives, and names in it that several layers check."""

from __future__ import annotations

import os
from pathlib import Path

#: the ``conf/`` directory (``DPBENCH_CONFIG_DIR`` points elsewhere)
CONF_DIR = os.environ.get("DPBENCH_CONFIG_DIR",
                          str(Path(__file__).resolve().parents[2] / "conf"))

#: ``trainer.grad_sample_mode`` values (checked by the schema, used by the loop and the bench)
GRAD_SAMPLE_MODES = ("auto", "hooks", "functorch", "ghost", "bk")  # auto: training/engine/choice.py

#: ``trainer.precision`` values, Lightning's names (training/precision.py); the first is the
#: default
PRECISIONS = ("32-true", "bf16-mixed")
#: precisions refused, and why (each breaks what clipping bounds)
REFUSED_PRECISIONS = {
    "16-mixed": "float16 needs loss scaling, which scales per-example gradients before they "
                "are clipped",
    "16-true": "float16 needs loss scaling, which scales per-example gradients before they "
               "are clipped",
    "bf16-true": "bf16 parameters would round the noisy update away; bf16-mixed keeps them "
                 "in float32",
}

#: settings added after runs were first recorded, with the value every earlier run had: left
#: out of resume fingerprints and choice keys while at that value, so earlier checkpoints and
#: choices files still match
ADDED_DEFAULTS = {
    "trainer": {"precision": "32-true"},
    # the privacy unit (privacy/user_level.py) and the user partition (data/users.py)
    "privacy": {"unit": "example", "user_strategy": "uls", "max_examples_per_user": 8},
    "dataset": {"users": "synthetic", "user_key": None, "num_users": None,
                "user_sizes": "zipf", "zipf_exponent": 1.0},
}


def without_added_defaults(settings: dict) -> dict:
    """Return ``settings`` (a config as plain dicts) without the ADDED_DEFAULTS at their value."""
    out = dict(settings)
    for group, defaults in ADDED_DEFAULTS.items():
        node = out.get(group)
        if isinstance(node, dict):
            out[group] = {k: v for k, v in node.items()
                          if not (k in defaults and v == defaults[k])}
    return out
