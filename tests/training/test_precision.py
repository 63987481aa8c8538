"""``trainer.precision=bf16-mixed``: a bf16 forward, a float32 mechanism.

The sensitivity bound is checked on neighbouring batches exactly as in float32 (the clipped
sum is made of the very float32 vectors whose norms were bounded), and the bf16 pre-noise sum
is compared with the float32 one on the same batch and state.
"""

from __future__ import annotations

import pytest
import torch

from dpbench.errors import ConfigError
from dpbench.experiment import build_trainer
from dpbench.training.step import SENSITIVITY_SLACK
from tests.helpers.config import compose_config
from tests.helpers.sensitivity import ADVERSARIAL_SCALE
from tests.helpers.sensitivity import aggregate as _aggregate
from tests.helpers.sensitivity import distance as _distance
from tests.helpers.sensitivity import scaled as _scaled

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

TINY = ["dataset=digits", "model=mlp", "trainer.epochs=1", "trainer.batch_size=32"]
BF16 = torch.finfo(torch.bfloat16).eps  # 2^-7: one bf16 rounding, relative
#: bf16 rounds the forward's inputs, weights and activations (about 3 roundings through the
#: 2-layer MLP) and the backward's output gradients: 16 roundings bound the relative error
RELEASE_RTOL = 16 * BF16


def _trainer(mode: str, precision: str):
    cfg = compose_config(*TINY, f"trainer.grad_sample_mode={mode}",
                         f"trainer.precision={precision}")
    trainer = build_trainer(cfg, None)
    assert trainer.engine.mode == mode
    return trainer


@pytest.mark.parametrize("mode", ["bk", "hooks", "functorch"])
def test_bf16_neighbouring_batches_within_sensitivity(mode):
    trainer = _trainer(mode, "bf16-mixed")
    state = trainer.noise_generator.get_state()
    data = trainer.data.train
    base = [data[i] for i in range(1, 17)]
    adversary = _scaled(data[0], ADVERSARIAL_SCALE, trainer.data.num_classes)
    huge, ctx = _aggregate(trainer, [adversary], state)
    assert huge.norms.dtype == torch.float32 and all(s.dtype == torch.float32
                                                     for s in huge.sums)
    assert float(huge.norms.max()) > 2 * trainer.mechanism.sensitivity(ctx)  # the clip is active
    for d, d_prime in ((base, base + [adversary]), (base + [adversary], base),
                       (base, base + [data[0]])):
        agg, ctx = _aggregate(trainer, d, state)
        agg_prime, _ = _aggregate(trainer, d_prime, state)
        bound = trainer.mechanism.sensitivity(ctx) * (1 + SENSITIVITY_SLACK)
        assert _distance(agg, agg_prime) <= bound


@pytest.mark.parametrize("mode", ["bk", "hooks"])
def test_bf16_pre_noise_sum_matches_float32_within_bf16_rounding(mode):
    fp32, bf16 = _trainer(mode, "32-true"), _trainer(mode, "bf16-mixed")
    bf16.model.load_state_dict(fp32.model.state_dict())
    data = fp32.data.train
    examples = [data[i] for i in range(32)]
    ref, _ = _aggregate(fp32, examples, fp32.noise_generator.get_state())
    got, _ = _aggregate(bf16, examples, bf16.noise_generator.get_state())
    assert not torch.equal(torch.cat([s.flatten() for s in ref.sums]),
                           torch.cat([s.flatten() for s in got.sums]))  # bf16 did run
    scale = float(torch.sqrt(sum((s ** 2).sum() for s in ref.sums)))
    assert _distance(ref, got) <= RELEASE_RTOL * scale
    assert torch.allclose(got.norms, ref.norms, rtol=RELEASE_RTOL, atol=0)


@pytest.mark.parametrize("value", ["16-mixed", "16-true", "bf16-true", "fp8"])
def test_precisions_that_break_clipping_are_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"trainer\.precision"):
        build_trainer(compose_config(*TINY, f"trainer.precision={value}"), None)


def test_ghost_clipping_is_refused_under_bf16():
    with pytest.raises(ConfigError, match=r"trainer\.precision=bf16-mixed.*ghost"):
        build_trainer(compose_config(*TINY, "trainer.grad_sample_mode=ghost",
                                     "trainer.precision=bf16-mixed"), None)


def test_a_bf16_run_records_its_precision_and_trains():
    result = build_trainer(compose_config(*TINY, "trainer.precision=bf16-mixed"), None).fit()
    assert result["precision"] == "bf16-mixed" and result["world_size"] == 1
    assert result["devices"] == ["cpu"]
    assert result["metrics"]["accuracy"] > 0.3  # 10 classes: it learned
