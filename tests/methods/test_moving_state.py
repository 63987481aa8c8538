"""A mechanism's moving parameters change in its ``advance`` alone, from released values: the
update holds no reference to the mechanism (tests/methods/test_boundary.py), and ``advance``
is handed a frozen ``Released`` (docs/privacy-review.md)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dpbench.methods.adaclip import COUNT_QUERY, geometric_update
from dpbench.methods.base import Released
from dpbench.training.loop import Callback
from tests.helpers.config import compose_config
from tests.helpers.method_matrix import method_overrides


def test_advance_is_handed_released_values_only():
    assert [f.name for f in dataclasses.fields(Released)] == ["step", "extras", "grads",
                                                              "public"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Released(step=0).step = 1  # type: ignore[misc]


def _recording(mechanism_cls):
    """Return ``mechanism_cls`` recording, as each step asks for its evaluation points, the
    threshold C_t and the previous weights theta_{t-1} it will use (a subclass: nothing is
    patched; the loop's callbacks see no mechanism)."""

    def evaluation_points(self, ctx):
        self.used.append({"threshold": getattr(self, "threshold", None),
                          "previous": [q.clone() for q in self.previous_params]
                          if getattr(self, "previous_params", None) is not None else None})
        return mechanism_cls.evaluation_points(self, ctx)

    def init(self, *args):
        mechanism_cls.__init__(self, *args)
        self.used = []

    return type(f"Recording{mechanism_cls.__name__}", (mechanism_cls,),
                {"__init__": init, "evaluation_points": evaluation_points})


class _Recorder(Callback):
    """Record each step's released count and the public weights after it."""

    def __init__(self) -> None:
        self.counts: list[float] = []
        self.weights: list[list[torch.Tensor]] = []  # theta_0, theta_1, ...

    def on_run_start(self, view) -> None:
        self.weights.append([w.clone() for w in view.weights])

    def on_release(self, view, released) -> None:
        if COUNT_QUERY in released.extras:
            self.counts.append(float(released.extras[COUNT_QUERY]))

    def on_step_end(self, view, metrics) -> None:
        self.weights.append([w.clone() for w in view.weights])


def _fit(name: str, *overrides: str) -> tuple[object, _Recorder]:
    from dpbench.experiment import build, build_method
    from dpbench.spec import build_spec
    from dpbench.training.loop import Trainer

    cfg = compose_config(*method_overrides(name), "trainer.epochs=1",
                         "trainer.checkpoint=false", *overrides)
    method = build_method(cfg)
    method = dataclasses.replace(method, mechanism_cls=_recording(method.mechanism_cls))
    recorder = _Recorder()
    trainer = build(build_spec(cfg), None, callbacks=[recorder],
                    make_trainer=lambda **kw: Trainer(**{**kw, "method": method}))
    trainer.fit()
    return trainer, recorder


@pytest.mark.integration
@pytest.mark.parametrize("name", ["adaclip", "bounded_adaclip"])
def test_the_threshold_is_the_geometric_update_of_the_noisy_counts(name):
    """C_{t+1} = max(C_LB, C_t exp(-eta_C (s_t / B + 1/2 - gamma))) from the released noisy
    counts s_t alone: the thresholds the steps used are recomputed exactly from them."""
    trainer, rec = _fit(name)
    s, mech = trainer.method.settings, trainer.mechanism
    thresholds = [u["threshold"] for u in mech.used]
    b, floor = trainer.plan.expected_batch_size, mech.clip_floor()
    assert len(rec.counts) == len(thresholds) == trainer.step > 3
    want = [thresholds[0]]
    for count in rec.counts:
        want.append(geometric_update(want[-1], count / b + 0.5, s.target_quantile, s.clip_lr,
                                     floor))
    assert thresholds == want[:-1] and mech.threshold == want[-1]  # bit-identical
    assert len(set(want)) > 3  # the threshold moved


@pytest.mark.integration
@pytest.mark.parametrize("name", ["disk", "fiber"])
def test_the_two_point_displacement_is_the_last_step_of_the_public_weights(name):
    """d_t = theta_t - theta_{t-1}: at step t >= 1 the mechanism's theta_{t-1} is exactly the
    weights step t-1 started from (post-processing of releases); none at step 0."""
    trainer, rec = _fit(name)
    previous = [u["previous"] for u in trainer.mechanism.used]
    assert previous[0] is None and len(previous) == trainer.step > 3
    for t in range(1, trainer.step):
        assert all(torch.equal(a, b) for a, b in zip(previous[t], rec.weights[t - 1]))
    assert not all(torch.equal(a, b) for a, b in zip(rec.weights[-1], rec.weights[-2]))
