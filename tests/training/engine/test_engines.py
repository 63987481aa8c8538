"""``trainer.grad_sample_mode=auto`` picks book-keeping where it is exact and hooks elsewhere;
a bk run trains the same model as a hooks run; the chosen engine is recorded."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.experiment import build_trainer
from dpbench.methods import get_method
from dpbench.methods.base import StepContext
from dpbench.models import get_model_builder
from dpbench.tasks import get_task
from dpbench.training.engine.choice import build_engine, choose_grad_sample_mode
from dpbench.training.step import clipped_aggregate, plan_at
from tests.helpers.config import compose_config
from tests.helpers.method_matrix import TINY
from tests.helpers.numerics import assert_matches_reference, float64_batch, float64_copy


def _trainer(*overrides: str):
    """Return a tiny digits trainer with a fixed sigma (no calibration: these tests are about
    the engine)."""
    cfg = compose_config(*TINY, "privacy=sigma", "privacy.noise_multiplier=1.0", *overrides)
    return build_trainer(cfg, None)


def test_auto_is_the_default_and_picks_bk_for_norm_only_methods():
    for method in ("dpsgd", "dpadamw", "adaclip", "autoclip", "dp_ivon"):
        trainer = _trainer(f"method={method}")
        assert trainer.settings.grad_sample_mode == "auto"
        assert trainer.grad_sample_mode == "bk" and trainer.engine.mode == "bk", method


def test_auto_picks_bk_for_methods_combining_several_points():
    """Two points per example (DiSK, FIBER) or several posterior samples (IVON): bk forms the
    combination's norm with its cross terms; the per-run check covers the two-point path."""
    for overrides in (("method=disk",), ("method=fiber",),
                      ("method=dp_ivon", "method.settings.mc_samples=2")):
        trainer = _trainer(*overrides)
        assert trainer.grad_sample_mode == "bk", overrides
        assert trainer.engine.combines_points


def test_auto_picks_hooks_where_gradients_must_be_materialised():
    linear = nn.Sequential(nn.Linear(2, 2))
    task = get_task("classification")()
    dpsgd = get_method("dpsgd").configured()
    assert choose_grad_sample_mode("auto", linear, dpsgd, task) == "bk"
    assert choose_grad_sample_mode("auto", linear, dpsgd, task, materialise=True) == "hooks"
    prelu = nn.Sequential(nn.Linear(2, 2), nn.PReLU())  # no book-keeping rule
    assert choose_grad_sample_mode("auto", prelu, dpsgd, task) == "hooks"
    nonprivate = build_trainer(compose_config(*TINY, "privacy=nonprivate"), None)
    assert nonprivate.grad_sample_mode is None  # nothing to clip


def test_bk_refused_for_runs_that_read_per_example_gradients():
    with pytest.raises(ConfigError, match="bk"):
        choose_grad_sample_mode("bk", nn.Linear(2, 2), get_method("dpsgd").configured(),
                                get_task("classification")(), materialise=True)


def test_bk_trains_the_same_model_as_hooks():
    """Same seed, same batches, same noise: parameters after 5 steps agree to float error."""
    finals = {}
    for mode in ("hooks", "bk"):
        trainer = _trainer("method=dpadam", f"trainer.grad_sample_mode={mode}")
        batches = iter(trainer.train_loader)
        for _ in range(5):
            trainer.train_step(next(batches))
        finals[mode] = torch.cat([p.detach().flatten() for p in trainer.params])
    diff = float((finals["bk"] - finals["hooks"]).norm() / finals["hooks"].norm())
    assert diff < 1e-5


def test_bk_feeds_the_diffusion_gradient_diagnostics_exactly():
    """The diffusion task's per-example norms (conditioning / rest) match hooks' under bk."""
    seen = {}
    b, length, k = 6, 8, 2
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randn(b, length, k, generator=gen), torch.ones(b, length, k),
             (torch.rand(b, length, k, generator=gen) < 0.5).float(),
             torch.randn(b, length, 5, generator=gen))
    for mode in ("hooks", "bk"):  # the reference: hooks on the model and batch in float64
        torch.manual_seed(0)
        model = get_model_builder("dit")((length, k), hidden=8, depth=1)
        for p in model.parameters():  # AdaLN-Zero starts at zero: make every path count
            torch.nn.init.normal_(p, std=0.3)
        if mode == "hooks":
            model = float64_copy(model)
        task = get_task("ts_diffusion")(diffusion_steps=8, resample_train_masks=False)
        assert task.observes_gradients
        method = get_method("dp_adaln").halves().mechanism
        engine = build_engine(model, mode)
        ctx = StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=1.0,
                          expected_batch_size=b, sample_rate=0.1, dataset_size=10 * b,
                          total_steps=1)
        torch.manual_seed(1)  # the task's per-example draws
        clipped_aggregate(method, engine, task, float64_batch(batch) if mode == "hooks" else batch,
                          ctx, plan_at(method, 1.0, b), None)
        seen[mode] = {key: torch.cat(v) for key, v in task._diag.items()}
    for key in ("g_cond", "g_rest", "g_total"):
        assert_matches_reference(seen["bk"][key], seen["hooks"][key].double(),
                                 dtype=torch.float32, reduction=length * 8, per_row=True,
                                 name=key)
    assert float(seen["bk"]["g_cond"].min()) > 0
