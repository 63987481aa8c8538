"""Adaptive clipping (Andrew et al. 2021): the noise split, the count query and the epsilon."""

from __future__ import annotations

import math

import pytest
import torch

from dpbench.errors import ConfigError
from dpbench.methods.adaclip import ADACLIP, COUNT_QUERY, geometric_update, gradient_sigma
from dpbench.methods.base import Released, StepContext
from dpbench.privacy.ledger import Query, combined_noise_multiplier
from tests.helpers.config import compose_config, run_config
from tests.helpers.method_steps import params_like, set_up

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

TINY = ["dataset=digits", "model=logreg", "trainer.epochs=1", "trainer.batch_size=200",
        "trainer.checkpoint=false", "privacy=sigma", "privacy.noise_multiplier=1.3"]


def _ctx(batch: float = 100.0) -> StepContext:
    return StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=1.0,
                       expected_batch_size=batch, sample_rate=0.1, dataset_size=1000,
                       total_steps=10)


@pytest.mark.parametrize(("sigma", "sigma_b"), [(1.0, 10.0), (2.0, 1.5), (0.7, 0.4)])
def test_sigma_delta_formula(sigma, sigma_b):
    sd = gradient_sigma(sigma, sigma_b)
    assert sd == pytest.approx((sigma**-2 - (2 * sigma_b) ** -2) ** -0.5, rel=1e-12)
    assert sd > sigma
    # the ledger combines the gradient (sensitivity S) and the centred count (sensitivity
    # 1/2, noise sigma_b: multiplier 2 sigma_b) back to exactly sigma
    queries = [Query("gradient", 3.0, sd * 3.0), Query(COUNT_QUERY, 0.5, sigma_b)]
    assert combined_noise_multiplier(queries) == pytest.approx(sigma, rel=1e-12)


def test_sigma_delta_reference_value():
    # sigma = 1, sigma_b = 1: (1 - 1/4)^(-1/2) = 2 / sqrt(3)
    assert gradient_sigma(1.0, 1.0) == pytest.approx(2 / math.sqrt(3), rel=1e-12)


@pytest.mark.parametrize(("sigma", "sigma_b"), [(2.0, 1.0), (3.0, 1.0)])
def test_sigma_at_or_above_twice_sigma_b_is_rejected(sigma, sigma_b):
    with pytest.raises(ConfigError, match="sigma < 2 sigma_b"):
        gradient_sigma(sigma, sigma_b)


def test_small_sigma_b_rejected_before_training():
    from dpbench.experiment import build_trainer

    cfg = compose_config(*TINY, "method=adaclip", "method.settings.sigma_b=0.5")
    with pytest.raises(ConfigError, match="sigma_b"):
        build_trainer(cfg, None)


def test_count_query_is_centred_with_half_sensitivity():
    method = ADACLIP.configured(count_threshold=2.0, sigma_b=7.0).halves()
    method.mechanism.threshold, method.mechanism.sigma_b = 1.5, 7.0
    norms = torch.tensor([0.1, 2.9, 3.0, 3.1, 10.0])
    (q,) = method.mechanism.extra_queries(norms, _ctx())
    assert q.name == COUNT_QUERY and q.sensitivity == 0.5 and q.noise_std == 7.0
    assert q.values.tolist() == [0.5, 0.5, 0.5, -0.5, -0.5]  # 1[||g|| <= theta C_t] - 1/2


def test_unclipped_fraction_recovered_from_centred_sum():
    method = set_up(ADACLIP.configured(clip_lr=0.2, target_quantile=0.5, initial_clip=2.0,
                                       sigma_b=1.0), params_like())  # expected batch size 100
    assert method.mechanism.threshold == 2.0
    # 100 expected examples, 80 of them unclipped: centred sum 80 * 0.5 - 20 * 0.5 = 30
    method.mechanism.advance(Released(step=0, extras={COUNT_QUERY: torch.tensor(30.0)}))
    assert method.mechanism.unclipped_fraction == pytest.approx(0.8)
    assert method.mechanism.threshold == pytest.approx(2.0 * math.exp(-0.2 * (0.8 - 0.5)))
    metrics = method.step_metrics()  # the update reports the threshold the step used
    assert metrics == {"clip_threshold": 2.0, "unclipped_fraction": pytest.approx(0.8)}
    assert method.summary()["clip_threshold_trajectory"] == [2.0]


def test_the_threshold_moves_only_with_a_released_count():
    method = set_up(ADACLIP.configured(initial_clip=2.0, sigma_b=1.0).halves(), params_like())
    method.mechanism.advance(Released(step=0))  # a non-private step: no count released
    method.mechanism.advance(Released(step=None))  # set-up / restore: no release
    assert method.mechanism.threshold == 2.0 and method.mechanism.trajectory == []


def test_geometric_update_direction_and_floor():
    assert geometric_update(1.0, 0.9, 0.5, 0.2, 0.0) < 1.0  # too many unclipped: shrink
    assert geometric_update(1.0, 0.1, 0.5, 0.2, 0.0) > 1.0  # too many clipped: grow
    assert geometric_update(0.1, 1.0, 0.5, 5.0, 0.05) == 0.05


def test_normalised_clipping_bounds_contributions_by_one():
    method = ADACLIP.configured(normalize=True).halves()
    method.mechanism.threshold = 0.3
    norms = torch.tensor([0.0, 0.1, 0.3, 1.0, 50.0])
    contrib = method.mechanism.clip_factors(norms, _ctx()) * norms
    assert float(contrib.max()) <= 1.0 + 1e-6 and method.mechanism.sensitivity(_ctx()) == 1.0
    assert contrib[1] == pytest.approx(0.1 / 0.3, rel=1e-4)  # unclipped: g / C_t
    assert contrib[4] == pytest.approx(1.0, rel=1e-4)


@pytest.mark.parametrize("method", ["adaclip", "bounded_adaclip"])
def test_epsilon_equals_dpsgd_at_same_sigma(method):
    """The reported epsilon is plain DP-SGD's at multiplier sigma, rate and steps."""
    ada = run_config(compose_config(*TINY, f"method={method}"))
    ref = run_config(compose_config(*TINY, "method=dpsgd"))
    assert ada["steps"] == ref["steps"] > 0
    assert ada["sample_rate"] == ref["sample_rate"]
    assert ada["epsilon"] == pytest.approx(ref["epsilon"], rel=1e-9)
    (entry,) = ada["privacy_ledger"]
    assert entry["noise_multiplier"] == pytest.approx(1.3, rel=1e-9)
    grad, count = entry["queries"]
    assert grad["noise_multiplier"] > 1.3  # the gradient alone gets sigma_delta > sigma
    assert count["sensitivity"] == 0.5
    assert count["noise_multiplier"] == pytest.approx(2 * ada["method_summary"]["sigma_b"])


def test_nonprivate_run_leaves_the_threshold_alone():
    out = run_config(compose_config("method=adaclip", "privacy=nonprivate", "dataset=digits",
                                    "model=logreg", "trainer.epochs=1",
                                    "trainer.checkpoint=false"))
    assert math.isinf(out["epsilon"])
    assert out["method_summary"]["clip_threshold_trajectory"] == []
