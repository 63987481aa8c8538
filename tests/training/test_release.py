"""The Gaussian release: clipped contributions bounded by C, noise std sigma C / B, guards."""

from __future__ import annotations

import pytest
import torch

from dpbench.errors import PrivacyError
from dpbench.methods import get_method
from dpbench.methods.base import Mechanism, StepContext
from dpbench.models import get_model_builder
from dpbench.tasks import get_task
from dpbench.training.engine.choice import build_engine
from dpbench.training.engine.materialised import flat_norms
from dpbench.training.step import plan_at, private_release


def _setup(mode="hooks", model="mlp", shape=(1, 8, 8), seed=0):
    torch.manual_seed(seed)
    net = get_model_builder(model)(shape, 10)
    engine = build_engine(net, mode)
    x = torch.randn(24, *shape) * 5
    y = torch.randint(0, 10, (24,))
    return net, engine, (x, y)


def _ctx(sigma=1.0, clip=0.5, batch=24.0):
    return StepContext(step=0, epoch=0, private=True, noise_multiplier=sigma, clip_norm=clip,
                       expected_batch_size=batch, sample_rate=0.1, dataset_size=240,
                       total_steps=1)


def _release(method, engine, task, batch, sigma=1.0, clip=0.5, b=24.0, seed=0,
             max_physical=None):
    """The release of ``batch`` at (sigma, C, B), its noise from a stream seeded ``seed``."""
    return private_release(method, engine, task, batch, _ctx(sigma, clip, b),
                           plan_at(method, sigma, b), max_physical,
                           noise=torch.Generator().manual_seed(seed))


def _method(name="dpsgd") -> Mechanism:
    """Return the mechanism of ``name`` (the half the release calls)."""
    return get_method(name).halves().mechanism


def test_each_clipped_contribution_has_norm_at_most_c():
    net, engine, batch = _setup()
    task = get_task("classification")()
    grads, _ = engine.per_example(task.per_example_loss, batch)
    norms = flat_norms(grads)
    assert norms.max() > 0.5  # the check below is not vacuous
    factors = _method().clip_factors(norms, _ctx(clip=0.5))
    clipped = flat_norms([factors.view(-1, *[1] * (g.dim() - 1)) * g for g in grads])
    assert float(clipped.max()) <= 0.5 * (1 + 1e-5)


def test_noise_std_is_sigma_c_over_b():
    """released(sigma) - released(0) on the same batch is N(0, (sigma C / B)^2) per coordinate."""
    net, engine, batch = _setup(model="cnn2", shape=(1, 28, 28))
    task, method = get_task("classification")(), _method()
    sigma, clip, b = 1.7, 0.5, 24.0
    noisy = _release(method, engine, task, batch, sigma, clip, b, seed=1)
    clean = _release(method, engine, task, batch, 0.0, clip, b)
    diff = torch.cat([(a - c).flatten() for a, c in zip(noisy.grads, clean.grads)])
    assert diff.numel() > 20000
    assert float(diff.std()) == pytest.approx(sigma * clip / b, rel=0.02)
    assert abs(float(diff.mean())) < 4 * sigma * clip / b / diff.numel() ** 0.5
    assert noisy.queries[0].noise_std == pytest.approx(sigma * clip)


def test_lying_method_is_refused():
    class NoClipping(Mechanism):
        def clip_factors(self, norms, ctx):
            return torch.ones_like(norms)

    net, engine, batch = _setup()
    with pytest.raises(PrivacyError, match="sensitivity"):
        _release(NoClipping("noclip_test", None), engine, get_task("classification")(), batch)


@pytest.mark.parametrize("mode", ["functorch", "ghost"])
def test_modes_release_the_same_as_hooks(mode):
    task, method = get_task("classification")(), _method()
    _, hooks, batch = _setup("hooks")
    _, other, _ = _setup(mode)
    ref = _release(method, hooks, task, batch, seed=3)
    got = _release(method, other, task, batch, seed=3)
    for a, b in zip(ref.grads, got.grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_virtual_batches_release_the_same():
    task, method = get_task("classification")(), _method()
    _, engine, batch = _setup()
    whole = _release(method, engine, task, batch, seed=4)
    chunked = _release(method, engine, task, batch, seed=4, max_physical=7)
    for a, b in zip(whole.grads, chunked.grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_empty_batch_releases_noise_only():
    task, method = get_task("classification")(), _method()
    _, engine, (x, y) = _setup()
    rel = _release(method, engine, task, (x[:0], y[:0]), 2.0, 0.5, 24.0)
    flat = torch.cat([g.flatten() for g in rel.grads])
    assert rel.realised_batch == 0
    assert float(flat.std()) == pytest.approx(2.0 * 0.5 / 24.0, rel=0.1)


@pytest.mark.parametrize("normalize", [False, True])
def test_clipped_fraction_counts_examples_scaled_to_the_bound(normalize):
    """The diagnostic counts examples cut to the sensitivity, for flat and normalised clipping."""
    task = get_task("classification")()
    method = get_method("dpsgd").configured(normalize=normalize).halves().mechanism
    _, engine, batch = _setup()
    norms = flat_norms(engine.per_example(task.per_example_loss, batch)[0])
    for clip in (float(norms.min()) / 2, float(norms.median()), float(norms.max()) * 2):
        rel = _release(method, engine, task, batch, clip=clip)
        expected = float((norms >= clip * (1 - 1e-4)).float().mean())  # at the bound = cut
        assert rel.clipped_fraction == pytest.approx(expected, abs=1e-6)
