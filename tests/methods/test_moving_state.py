"""A mechanism's moving parameters change in its ``advance`` alone, from released values; an
update reads them through a read-only view and cannot assign them (docs/privacy-review.md)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dpbench.errors import PrivacyError
from dpbench.methods import METHODS, get_method
from dpbench.methods.adaclip import COUNT_QUERY, geometric_update
from dpbench.methods.base import DPMethod, Mechanism, Released, Update
from dpbench.training.loop import Callback
from tests.helpers.config import compose_config
from tests.helpers.method_matrix import method_overrides
from tests.helpers.method_steps import ctx, params_like, post_release, set_up

BUILTIN = sorted(n for n in METHODS if METHODS.get(n).__module__.startswith("dpbench."))


@pytest.mark.parametrize("name", BUILTIN)
def test_an_update_cannot_assign_or_delete_its_mechanisms_state(name):
    method = get_method(name)()
    view = method.updater.mechanism
    for attr in ("threshold", "previous_params", "posterior_std", "params", "settings"):
        with pytest.raises(AttributeError, match="cannot set"):
            setattr(view, attr, None)
    with pytest.raises(AttributeError, match="cannot delete"):
        delattr(view, "settings")
    for call in ("advance", "setup", "load_state_dict"):
        with pytest.raises(AttributeError, match="advance hook alone"):
            getattr(view, call)
    assert view.settings is method.settings  # reading is allowed


class _Writer(Mechanism):
    def setup(self, params, info) -> None:
        super().setup(params, info)
        self.level = 1.0
        self.history = [1.0]


class _SneakyUpdate(Update):
    """An update that tries to move its mechanism's parameter itself."""

    def after_step(self, released, ctx) -> None:
        self.mechanism.level = 2.0


class _MutatingUpdate(Update):
    def after_step(self, released, ctx) -> None:
        self.mechanism.history.append(2.0)  # a list is handed out as a tuple


@pytest.mark.parametrize("update_cls", [_SneakyUpdate, _MutatingUpdate])
def test_a_step_whose_update_writes_its_mechanism_is_refused(update_cls):
    method = type("Sneaky", (DPMethod,), {"mechanism_cls": _Writer, "update_cls": update_cls})
    method = set_up(method(), params_like())
    with pytest.raises(AttributeError):
        post_release(method, [torch.zeros_like(p) for p in method.params], ctx())
    assert method.mechanism.level == 1.0 and method.mechanism.history == [1.0]


class _TensorState(Mechanism):
    def setup(self, params, info) -> None:
        super().setup(params, info)
        self.scale = torch.ones(3)
        self.previous = [torch.zeros(2), torch.zeros(2)]
        self.moved = 0

    def advance(self, released) -> None:
        self.scale.mul_(1.0)  # the mechanism's own in-place write, in advance: allowed
        self.moved += 1


class _InPlaceUpdate(Update):
    """Changes a tensor the view hands out in place: assignment is refused by the view, an
    in-place write by the tensor's version counter."""

    def after_step(self, released, ctx) -> None:
        self.mechanism.previous[0].add_(1.0)


class _InPlaceInSetup(Update):
    def setup(self, params, info) -> None:
        super().setup(params, info)
        self.mechanism.scale.zero_()


class _ReadingUpdate(Update):
    def after_step(self, released, ctx) -> None:
        self.seen = float(self.mechanism.scale.sum() + self.mechanism.previous[1].sum())


def _pair(update_cls):
    return type("Pair", (DPMethod,), {"mechanism_cls": _TensorState, "update_cls": update_cls})


def test_an_update_writing_its_mechanisms_tensor_in_place_is_refused():
    method = set_up(_pair(_InPlaceUpdate)(), params_like())
    with pytest.raises(PrivacyError, match="in place during the update"):
        post_release(method, [torch.zeros_like(p) for p in method.params], ctx())
    assert method.mechanism.moved == 1  # advance did not run after the write (1: set-up)
    with pytest.raises(PrivacyError, match="in place during setup"):
        set_up(_pair(_InPlaceInSetup)(), params_like())


def test_bandmfs_coefficients_and_settings_cannot_be_changed_through_the_view():
    """NumPy arrays have no version counter: the view hands them out read-only."""
    method = set_up(get_method("bandmf")(), params_like())
    coefs = method.updater.mechanism.coefs
    with pytest.raises(ValueError, match="read-only"):
        coefs[0] = 0.0
    method.updater.mechanism.config.bands = 1  # lands in a copy
    assert method.mechanism.config.bands == method.settings["bands"] > 1
    assert method.mechanism.coefs.flags.writeable  # the mechanism's own array is untouched


def test_reading_and_the_mechanisms_own_writes_and_the_weights_pass():
    method = set_up(_pair(_ReadingUpdate)(), params_like())
    before = [p.detach().clone() for p in method.params]
    for step in range(3):  # the update moves the weights in place, advance its own tensor
        post_release(method, [torch.ones_like(p) for p in method.params], ctx(step))
    assert method.mechanism.moved == 4 and method.updater.seen == 3.0
    assert all(not torch.equal(a, p) for a, p in zip(before, method.params))


def test_advance_is_handed_released_values_only():
    assert [f.name for f in dataclasses.fields(Released)] == ["step", "extras", "grads",
                                                              "public"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Released(step=0).step = 1  # type: ignore[misc]


class _Recorder(Callback):
    """Record each step's released count, the threshold it used and the weights after it."""

    def __init__(self) -> None:
        self.counts: list[float] = []
        self.thresholds: list[float] = []
        self.weights: list[list[torch.Tensor]] = []  # theta_0, theta_1, ...
        self.previous: list[list[torch.Tensor] | None] = []  # theta_{t-1} at step t

    def on_run_start(self, trainer) -> None:
        self.weights.append([p.detach().clone() for p in trainer.params])

    def on_step_start(self, trainer) -> None:
        mech = trainer.method.mechanism
        if hasattr(mech, "threshold"):
            self.thresholds.append(mech.threshold)
        if hasattr(mech, "previous_params"):
            prev = mech.previous_params
            self.previous.append(None if prev is None else [q.clone() for q in prev])

    def on_release(self, trainer, release) -> None:
        if COUNT_QUERY in release.noisy_extras:
            self.counts.append(float(release.noisy_extras[COUNT_QUERY]))

    def on_step_end(self, trainer, metrics) -> None:
        self.weights.append([p.detach().clone() for p in trainer.params])


def _fit(name: str, *overrides: str) -> tuple[object, _Recorder]:
    from dpbench.experiment import build_trainer

    trainer = build_trainer(compose_config(*method_overrides(name), "trainer.epochs=1",
                                           "trainer.checkpoint=false", *overrides), None)
    recorder = _Recorder()
    trainer.callbacks.append(recorder)
    trainer.fit()
    return trainer, recorder


@pytest.mark.integration
@pytest.mark.parametrize("name", ["adaclip", "bounded_adaclip"])
def test_the_threshold_is_the_geometric_update_of_the_noisy_counts(name):
    """C_{t+1} = max(C_LB, C_t exp(-eta_C (s_t / B + 1/2 - gamma))) from the released noisy
    counts s_t alone: the thresholds the steps used are recomputed exactly from them."""
    trainer, rec = _fit(name)
    s, mech = trainer.method.settings, trainer.method.mechanism
    b, floor = trainer.plan.expected_batch_size, mech.clip_floor()
    assert len(rec.counts) == len(rec.thresholds) == trainer.step > 3
    want = [rec.thresholds[0]]
    for count in rec.counts:
        want.append(geometric_update(want[-1], count / b + 0.5, s["target_quantile"],
                                     s["clip_lr"], floor))
    assert rec.thresholds == want[:-1] and mech.threshold == want[-1]  # bit-identical
    assert len(set(want)) > 3  # the threshold moved


@pytest.mark.integration
@pytest.mark.parametrize("name", ["disk", "fiber"])
def test_the_two_point_displacement_is_the_last_step_of_the_public_weights(name):
    """d_t = theta_t - theta_{t-1}: at step t >= 1 the mechanism's theta_{t-1} is exactly the
    weights step t-1 started from (post-processing of releases); none at step 0."""
    trainer, rec = _fit(name)
    assert rec.previous[0] is None and len(rec.previous) == trainer.step > 3
    for t in range(1, trainer.step):
        assert all(torch.equal(a, b) for a, b in zip(rec.previous[t], rec.weights[t - 1]))
    assert not all(torch.equal(a, b) for a, b in zip(rec.weights[-1], rec.weights[-2]))
