"""Spectral denoising: Gavish-Donoho shrinker, gate, norm preservation, denoising gain, privacy."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from dpbench.errors import ConfigError
from dpbench.methods.base import Halves, StepContext
from dpbench.methods.spectral_denoise import SPECTRAL_DENOISE, denoise_matrices, optimal_shrinkage
from tests.helpers.config import compose_config, run_config
from tests.helpers.method_steps import info
from tests.helpers.numerics import assert_matches_reference

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick


def _low_rank_plus_noise(n: int, m: int, rank: int, signal: float, s: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(n, rank, generator=g))
    v, _ = torch.linalg.qr(torch.randn(m, rank, generator=g))
    strengths = signal * s * (math.sqrt(n) + math.sqrt(m)) * torch.linspace(2.0, 1.2, rank)
    clean = (u * strengths) @ v.T
    return clean, clean + s * torch.randn(n, m, generator=g)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_shrinker_matches_normalised_closed_form():
    """s_i' equals Gavish-Donoho's eta(y) = sqrt((y^2-b-1)^2-4b)/y in units of s sqrt(m)."""
    n, m, s = 12, 300, 0.37
    beta = n / m
    y = np.array([0.2, 0.9, 1 + math.sqrt(beta) - 1e-6, 1 + math.sqrt(beta) + 1e-3, 1.5, 3.0,
                  10.0])
    eta = np.where(y >= 1 + math.sqrt(beta),
                   np.sqrt(np.clip((y**2 - beta - 1) ** 2 - 4 * beta, 0, None)) / y, 0.0)
    sv = torch.tensor(y * s * math.sqrt(m), dtype=torch.float64)
    got = optimal_shrinkage(sv, s, n, m).numpy() / (s * math.sqrt(m))
    np.testing.assert_allclose(got, eta, rtol=1e-9, atol=1e-12)
    assert got[0] == got[1] == got[2] == 0.0  # below the bulk edge: killed
    assert got[-1] < y[-1] and got[-1] > y[-1] - 1.1 * (1 + beta) / y[-1]  # eta(y) ~ y - (1+b)/y


@pytest.mark.parametrize("shape", [(8, 384), (384, 8), (64, 64)])
def test_denoised_is_closer_and_better_aligned(shape):
    n, m = shape
    s = 0.01
    clean, noisy = _low_rank_plus_noise(n, m, rank=3, signal=1.5, s=s, seed=1)
    out, passed = denoise_matrices(noisy[None], s)
    assert bool(passed[0])
    assert (out[0] - clean).norm() < (noisy - clean).norm()
    assert _cos(out[0], clean) > _cos(noisy, clean) + 0.05
    # shrinkage alone (before the norm-preserving rescale) is also closer than the noisy matrix
    u, sv, vh = torch.linalg.svd(noisy, full_matrices=False)
    shrunk = (u * optimal_shrinkage(sv, s, n, m)) @ vh
    assert (shrunk - clean).norm() < (noisy - clean).norm()


def test_norm_preserved_and_below_gate_unchanged():
    s = 0.02
    _, strong = _low_rank_plus_noise(16, 200, rank=2, signal=2.0, s=s, seed=2)
    weak = 0.5 * s * torch.randn(16, 200, generator=torch.Generator().manual_seed(3))
    out, passed = denoise_matrices(torch.stack([strong, weak]), s)
    assert passed.tolist() == [True, False]
    assert_matches_reference(out[0].norm(), strong.double().norm(), dtype=torch.float32,
                             reduction=16 * 200, name="norm")
    assert torch.equal(out[1], weak)  # below the gate: bit-for-bit unchanged
    assert not torch.allclose(out[0], strong)
    # a larger kappa moves the gate above the strong matrix too
    out_k, passed_k = denoise_matrices(strong[None], s, kappa=10.0)
    assert not bool(passed_k[0]) and torch.equal(out_k[0], strong)


def _method(**settings) -> Halves:
    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Tanh(), torch.nn.Linear(30, 3))
    method = SPECTRAL_DENOISE.configured(**settings).halves()
    names = tuple(name for name, _ in model.named_parameters())
    method.update.setup(list(model.parameters()), dataclasses.replace(info(), param_names=names))
    return method


def _ctx(noise_std: float, private: bool = True) -> StepContext:
    return StepContext(step=0, epoch=0, private=private, noise_multiplier=1.0, clip_norm=1.0,
                       expected_batch_size=10.0, sample_rate=0.1, dataset_size=100,
                       total_steps=1, noise_std=noise_std)


def test_postprocess_selects_matrices_and_reports():
    method = _method(targets="all_2d")
    assert method.update.selected == [0, 2]  # the two weights; biases untouched
    s = 0.01
    clean, noisy = _low_rank_plus_noise(30, 40, rank=2, signal=2.0, s=s, seed=4)
    grads = [noisy, torch.randn(30), s * torch.randn(3, 30), torch.randn(3)]
    out = method.update.postprocess(grads, _ctx(s))
    assert out[1] is grads[1] and out[3] is grads[3]
    assert _cos(out[0], clean) > _cos(noisy, clean)
    metrics = method.step_metrics()
    assert metrics["denoise_matrices"] == 2 and 1 <= metrics["denoise_passed"] <= 2
    assert 0 < metrics["denoise_cosine"] < 1
    # non-private runs (no noise) are left alone
    assert method.update.postprocess(grads, _ctx(0.0, private=False)) is grads


def test_bad_settings_and_no_lora_matrix_raise():
    with pytest.raises(ConfigError, match="targets"):
        SPECTRAL_DENOISE.configured(targets="everything").halves().mechanism.validate(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="kappa"):
        SPECTRAL_DENOISE.configured(kappa=0).halves().mechanism.validate(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no trainable 2-D parameter"):
        _method(targets="lora")


def test_same_epsilon_and_ledger_as_the_baseline(tmp_path):
    """Post-processing: same sigma, ledger and epsilon as DP-Adam; the update differs."""
    common = ["dataset=digits", "model=mlp", "trainer.epochs=1", "trainer.batch_size=256",
              "trainer.checkpoint=false", "privacy=sigma",
              "privacy.noise_multiplier=1.0", "privacy.accountant=rdp"]
    base = run_config(compose_config("method=dpadam", *common))
    spec = run_config(compose_config("method=spectral_denoise", "method.settings.targets=all_2d",
                                     "method.optimizer.lr=0.005", *common))
    assert spec["epsilon"] == base["epsilon"]
    assert spec["noise_multiplier"] == base["noise_multiplier"]
    assert spec["privacy_ledger"] == base["privacy_ledger"]
    assert spec["method_summary"]["denoised_matrices"] == 2
    assert spec["metrics"]["accuracy"] != base["metrics"]["accuracy"] or (
        spec["metrics"]["loss"] != base["metrics"]["loss"])
