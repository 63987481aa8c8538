"""The per-method tiny test configurations every privacy and fault test is parametrised over.

``METHOD_TEST_CONFIGS`` maps each registered method to the Hydra overrides of a run that takes
seconds on a CPU. Every entry starts from ``TINY`` (scikit-learn digits, an MLP, one epoch);
a method whose ``tasks`` exclude classification lists its task's tiny data set and model
here. A registered method missing from this table FAILS ``method_overrides`` (and the
coverage test), so a new method cannot land without privacy tests: add one line here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpbench.methods import get_method, method_names
from dpbench.utils.conf import CONF_DIR
from tests.helpers.synthetic import method_matrix_root

#: shared by every entry: real data, no data root, one epoch, no checkpoint, quiet
TINY: tuple[str, ...] = ("dataset=digits", "model=mlp", "model.hidden=16", "privacy=eps3",
                         "trainer.epochs=1", "trainer.batch_size=64", "trainer.checkpoint=false",
                         "seed=0")

#: stands for ``paths.data_root=<a folder of synthetic files>`` (written on first use)
SYNTHETIC_ROOT = "paths.data_root=<synthetic>"
#: tiny SST-2 run of the packaged MiniLM with LoRA (offline; synthetic GLUE TSVs)
TEXT = ("dataset=sst2", SYNTHETIC_ROOT, "model=minilm_lora",
        "dataset.train_size=48", "dataset.test_size=16", "dataset.max_length=12",
        "trainer.batch_size=16")
#: tiny ETTh1 imputation run of the AdaLN-Zero diffusion transformer (synthetic ETT CSV)
TIME_SERIES = ("dataset=etth1", SYNTHETIC_ROOT, "dataset.window=8",
               "dataset.max_train_windows=256", "dataset.max_test_windows=16", "model=dit",
               "model.hidden=8", "model.depth=1", "trainer.batch_size=32",
               "+task.diffusion_steps=8", "+task.num_samples=3")

#: method -> extra overrides (after TINY); a new method adds its line here
METHOD_TEST_CONFIGS: dict[str, tuple[str, ...]] = {
    "dpsgd": (),
    "dpadam": (),
    "dpadamw": (),
    "nonprivate": ("privacy=nonprivate",),
    "adaclip": (),
    "bounded_adaclip": (),
    "autoclip": (),
    "dpadam_bc": (),
    "disk": (),
    "fiber": (),
    "dp_ivon": (),
    "ivon": ("privacy=nonprivate",),
    "dplora": TEXT,
    "spectral_denoise": TEXT,
    "dp_adaln": TIME_SERIES,
    "dp_vanilla": TIME_SERIES,
    "bandmf": (),
}


def all_methods() -> list[str]:
    """Return every registered method name (built-ins and entry-point plugins)."""
    return method_names()


#: the engines every privacy test runs: materialised per-example gradients and book-keeping
ENGINE_MODES = ("hooks", "bk")


def method_mode_params() -> list:
    """Return pytest params (method, grad-sample mode): each private method under every engine
    it can use, a non-private one once."""
    params = []
    for name in all_methods():
        method = get_method(name)
        modes = ENGINE_MODES if method.private else ENGINE_MODES[:1]
        for mode in modes:
            if mode == "bk" and method.needs_per_example_grads:
                continue  # reads materialised gradients: refused in bk, runs under hooks
            params.append(pytest.param(name, mode, id=f"{name}-{mode}"))
    return params


def method_overrides(name: str, mode: str | None = None) -> list[str]:
    """Return the overrides of ``name``'s tiny run (under grad-sample ``mode`` if given);
    fail (not skip) if it has none."""
    if name not in METHOD_TEST_CONFIGS:
        pytest.fail(
            f"method {name!r} is registered but has no tiny test config: add it to "
            "METHOD_TEST_CONFIGS in tests/helpers/method_matrix.py (default: an empty tuple "
            "runs it on digits/mlp for one epoch; methods for other tasks name their tiny "
            "data set)",
            pytrace=False)
    if (Path(CONF_DIR) / "method" / f"{name}.yaml").is_file():
        chosen = [f"method={name}"]
    else:  # an entry-point plugin without a YAML file in conf/
        chosen = ["method=plugin", f"method.name={name}"]
    extra = METHOD_TEST_CONFIGS[name]
    base = list(TINY)
    if any(o.startswith("model=") for o in extra):  # another task's model: drop the MLP's keys
        base = [o for o in base if not o.startswith("model")]
    if SYNTHETIC_ROOT in extra:
        extra = tuple(f"paths.data_root={method_matrix_root()}" if o == SYNTHETIC_ROOT else o
                      for o in extra)
    engine = [f"trainer.grad_sample_mode={mode}"] if mode else []
    return [*base, *chosen, *extra, *engine]


def is_private(name: str) -> bool:
    return bool(get_method(name).private)
