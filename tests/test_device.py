"""The accelerator path, checked on the device itself: ``make test-device`` (marker ``device``).

Every code path must also run on CUDA (``trainer.device=auto``). These checks run there: the
book-keeping engine equals Opacus hooks on the device (per example, and per user with ghost
clipping too), short runs of a one-point method (bk), a two-point method (bk and hooks) and
BandMF (correlated-noise state on the device) train there and spend exactly the epsilon of the
same run on CPU, a resumed run equals an uninterrupted one, frozen-prefix caching equals the
uncached run, and ``dpbench-bench --device`` prints its table. ``DPBENCH_TEST_DEVICE`` names
the device (default ``cuda``); a missing device fails, never skips. ``DPBENCH_TEST_DEVICE=cpu
make test-device`` checks the suite itself on CPU.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os

import pytest
import torch

from tests.helpers.bk_cases import bk_clipped_sum as _bk
from tests.helpers.bk_cases import hooks_reference as _reference
from tests.helpers.bk_cases import tiny_case as _case
from tests.helpers.config import compose_config, run_config
from tests.helpers.text_runs import minilm_run as _run_text

pytestmark = pytest.mark.device

#: float32 on the device, TF32 off: the engines' summation orders differ from Opacus's
DEVICE_REL = 1e-4
#: the models book-keeping is checked on (offline, every layer type the registry uses)
MODELS = ("mlp", "cnn2", "resnet18", "dit", "minilm_lora")


@pytest.fixture(scope="module")
def device() -> torch.device:
    """Return ``DPBENCH_TEST_DEVICE`` (default cuda); fail if this machine lacks it."""
    name = os.environ.get("DPBENCH_TEST_DEVICE", "cuda")
    dev = torch.device(name)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if dev.type == "cuda" and (dev.index or 0) >= count:
        pytest.fail(f"DPBENCH_TEST_DEVICE={name} but this machine has {count} CUDA device(s): "
                    "run make test-device on a GPU machine (DPBENCH_TEST_DEVICE=cpu checks the "
                    "suite itself)", pytrace=False)
    return dev


@contextlib.contextmanager
def _full_float32():
    """Turn TF32 off for an exactness check (torch lets cuDNN convolutions use it)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _to(obj, device: torch.device):
    """Return ``obj`` (a tensor, or tuples/lists of them) on ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, device) for o in obj)
    return obj


@pytest.mark.parametrize("name", MODELS)
def test_bk_equals_hooks_on_the_device(name, device):
    model, loss_fn, batch = _case(name)
    model, batch = model.to(device), _to(batch, device)
    with _full_float32():
        ref_sums, ref_norms = _reference(copy.deepcopy(model), loss_fn, batch)
        sums, norms, factors = _bk(model, loss_fn, batch)
    assert all(s.device.type == device.type for s in sums)
    assert float((factors < 1).float().mean()) > 0.5  # the clipping is active
    assert torch.allclose(norms, ref_norms, rtol=DEVICE_REL, atol=0)
    for s, r in zip(sums, ref_sums):
        assert float((s - r).norm()) <= DEVICE_REL * (float(r.norm()) + 1e-12)


@pytest.mark.parametrize("mode", ["bk", "ghost"])
def test_per_user_clipping_equals_hooks_on_the_device(mode, device):
    """privacy.unit=user (ULS): bk's and ghost's per-user norms and clipped sums on the
    device equal hooks' per-user path (users of 3, 2 and 1 rows, out of order)."""
    from dpbench.training.engine.choice import build_engine
    from tests.helpers.engines import ONE_POINT
    from tests.training.engine.test_per_user_engines import _ce, _clip, _project_model

    model, batch = _project_model("cnn2")
    model, batch = model.to(device), _to(batch, device)
    users = torch.tensor([4, 1, 4, 9, 1, 4, 6, 6, 6, 2], device=device)
    outs = {}
    with _full_float32():
        for m in ("hooks", mode):
            engine = build_engine(copy.deepcopy(model), m)
            outs[m] = engine.clipped_user_sum(_ce, batch, users, ONE_POINT, _clip(0.05))
            engine.close()
    got, want = outs[mode], outs["hooks"]
    assert all(s.device.type == device.type for s in got.sums)
    assert got.kept.tolist() == want.kept.tolist() == [True] * 5
    assert torch.allclose(got.norms, want.norms, rtol=DEVICE_REL, atol=0)
    for s, r in zip(got.sums, want.sums):
        assert float((s - r).norm()) <= DEVICE_REL * (float(r.norm()) + 1e-12)


@pytest.mark.parametrize("method,mode", [("dpsgd", "bk"), ("fiber", "bk"), ("fiber", "hooks"),
                                         ("bandmf", "bk")])
def test_a_run_on_the_device_spends_the_cpu_runs_epsilon(method, mode, device, tmp_path):
    """The same config on the device and on CPU: the accountant does not see the device.
    FIBER (two points) runs under auto's choice (bk) and under materialised hooks."""
    from dpbench.experiment import build_trainer

    engine = [] if mode == "bk" else [f"trainer.grad_sample_mode={mode}"]
    overrides = [f"method={method}", "trainer.epochs=1", *engine]
    on_cpu = run_config(compose_config(*overrides), tmp_path / "cpu")
    cfg = compose_config(*overrides)
    cfg.trainer.device = str(device)
    trainer = build_trainer(cfg, tmp_path / "device")
    on_device = trainer.fit()
    assert trainer.device.type == device.type
    assert all(p.device.type == device.type for p in trainer.model.parameters())
    assert on_device["grad_sample_mode"] == mode
    assert on_device["epsilon"] == on_cpu["epsilon"]
    assert on_device["noise_multiplier"] == on_cpu["noise_multiplier"]
    assert on_device["steps"] == on_cpu["steps"]
    accuracy = on_device["metrics"]["accuracy"]
    assert math.isfinite(accuracy) and accuracy > 0.2  # 10 classes: above chance


def test_a_resumed_run_on_the_device_continues_the_same_accountant(device, tmp_path):
    """Killed mid-epoch 2 and resumed on the device: the same ledger, steps and epsilon."""
    from dpbench.experiment import build_trainer
    from tests.helpers.callbacks import Crash as _Crash

    def cfg(*extra: str):
        out = compose_config("trainer.epochs=3", *extra)
        out.trainer.device = str(device)
        return out

    full = run_config(cfg(), tmp_path / "full")
    crashed = build_trainer(cfg(), tmp_path / "crashed", [_Crash(epoch=2, after=4)])
    with pytest.raises(KeyboardInterrupt):
        crashed.fit()
    assert crashed.step > crashed.plan.steps_per_epoch  # killed mid-epoch 2
    resumed = build_trainer(cfg("trainer.resume=true"), tmp_path / "crashed").fit()
    assert resumed["privacy_ledger"] == full["privacy_ledger"]
    assert resumed["epsilon"] == full["epsilon"] and resumed["steps"] == full["steps"]
    assert [r["epoch"] for r in resumed["history"]] == [1, 2, 3]


def test_minilm_prefix_cache_equals_the_uncached_run_on_the_device(device):
    with _full_float32():
        cached, with_cache = _run_text("on", "bk", str(device))
        plain, without = _run_text("off", "bk", str(device))
    assert with_cache["epsilon"] == without["epsilon"]
    a = dict(cached.model.named_parameters())
    b = {k: v for k, v in plain.model.named_parameters() if v.requires_grad}
    assert len(b) > 2
    for name, value in b.items():  # the cached model wraps the plain one: match by suffix
        key = next(k for k in a if k.endswith(name))
        assert a[key].device.type == device.type
        torch.testing.assert_close(a[key], value, rtol=DEVICE_REL, atol=DEVICE_REL)


def test_bench_runs_on_the_device(device, capsys):
    from dpbench.bench import main

    assert main(["--models", "mlp", "--modes", "bk", "--batch-size", "64", "--reps", "2",
                 "--warmup", "1", "--rounds", "1", "--device", str(device)]) == 0
    out = capsys.readouterr().out
    assert f"device {device.type}" in out and "| mlp | dpbench bk | 64 |" in out
