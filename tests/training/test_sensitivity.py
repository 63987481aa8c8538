"""Neighbouring batches through the loop's own release code: the pre-noise aggregate moves by
at most the sensitivity the accountant assumes, for the gradient and every extra query.

``clipped_aggregate`` is the first half of ``private_release`` (the sums the Gaussian noise is
added to), so these tests exercise exactly what training runs, at the method's evaluation
points and with its state after a few real steps (DiSK's direction, adaptive C_t, IVON's h).
"""

from __future__ import annotations

import pytest

from dpbench.errors import PrivacyError
from dpbench.experiment import build_trainer
from dpbench.training.step import SENSITIVITY_SLACK
from tests.helpers.config import compose_config
from tests.helpers.method_matrix import is_private, method_mode_params, method_overrides
from tests.helpers.sensitivity import (
    ADVERSARIAL_SCALE,
    adversarial_example,
    aggregate,
    distance,
    scaled,
    trained_trainer,
)
from tests.helpers.wrapped import unclipped

pytestmark = pytest.mark.privacy_matrix  # make test-privacy


@pytest.mark.parametrize("name,mode", method_mode_params())
def test_neighbouring_batches_within_sensitivity(name, mode):
    if not is_private(name):
        trainer = build_trainer(compose_config(*method_overrides(name, mode)), None)
        assert not trainer.plan.private and trainer.engine is None  # nothing is released
        return
    trainer = trained_trainer(name, mode=mode)
    state = trainer.noise_generator.get_state()
    data = trainer.data.train
    base = [data[i] for i in range(1, 17)]
    for scale in (ADVERSARIAL_SCALE, 1e2, 1e1):  # the largest scale whose gradient is finite
        adversary = scaled(data[0], scale, trainer.data.num_classes)
        huge, ctx = aggregate(trainer, [adversary], state)  # a non-finite one is dropped
        if huge.norms.numel() and float(huge.norms.max()) > 2 * trainer.mechanism.sensitivity(ctx):
            break
    neighbours = {  # the differing example is last (see aggregate)
        "added huge example": (base, base + [adversary]),
        "added ordinary example": (base, base + [data[0]]),
        "removed example": (base + [data[0]], base),
        "replaced-by-removal of the huge one": (base + [adversary], base),
    }
    for label, (d, d_prime) in neighbours.items():
        agg, ctx = aggregate(trainer, d, state)
        agg_prime, _ = aggregate(trainer, d_prime, state)
        bound = trainer.mechanism.sensitivity(ctx) * (1 + SENSITIVITY_SLACK)
        assert distance(agg, agg_prime) <= bound, f"{name}, {label}: gradient sum moved too far"
        for qname, spec in agg.extra_specs.items():
            diff = abs(float(agg.extra_sums.get(qname, 0.0))
                       - float(agg_prime.extra_sums.get(qname, 0.0)))
            assert diff <= spec.sensitivity * (1 + SENSITIVITY_SLACK), f"{name}: {qname}"
        assert [q.name for q in agg.queries] == [q.name for q in agg_prime.queries]
    huge, _ = aggregate(trainer, [adversary], state)
    assert float(huge.norms.max()) > 2 * trainer.mechanism.sensitivity(ctx)  # clip active


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_unclipped_contribution_is_refused(monkeypatch, mode):
    """Negative control: with clipping switched off the loop's release refuses the batch."""
    trainer = trained_trainer("dpsgd", steps=1, mode=mode)
    no_clip = unclipped(type(trainer.mechanism))(trainer.method.name, trainer.method.settings)
    adversary = adversarial_example(trainer.data)
    with pytest.raises(PrivacyError, match="sensitivity"):
        aggregate(trainer, [trainer.data.train[1], adversary],
                  trainer.noise_generator.get_state(), no_clip)
