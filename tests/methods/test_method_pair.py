"""A method is a mechanism (every hook that can change epsilon) and an update (post-processing)."""

from __future__ import annotations

import inspect

import pytest
import torch

from dpbench.methods import METHODS, get_method, method_names
from dpbench.methods.base import DPMethod, Mechanism, MechanismView, Update
from dpbench.methods.disk import DiSK, TwoPointObservation
from dpbench.methods.dpadam_bc import AdamBC, DPAdamBC, NoiseCorrectedAdam
from dpbench.methods.fiber import FIBER
from dpbench.methods.mechanism import PRIVACY_HOOKS
from dpbench.methods.update import UPDATE_HOOKS
from tests.helpers.method_steps import ctx, params_like, post_release, set_up

#: the hooks whose result enters the release or the accountant: sampling, the points where
#: gradients are taken, clipping and its bound, the noise multiplier and shape, extra queries,
#: and the one writer of the mechanism's moving parameters (``advance``)
EPSILON_HOOKS = {"participation_bands", "evaluation_points", "clip_factors", "sensitivity",
                 "gradient_noise_multiplier", "extra_queries", "noise_shaper", "advance"}
#: what each half keeps besides its hooks: set-up, facts for results.json, checkpoint state
HOUSEKEEPING = {"setup", "summary", "state_dict", "load_state_dict"}
BUILTIN = [n for n in method_names() if METHODS.get(n).__module__.startswith("dpbench.")]


def _public_methods(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}


def test_the_mechanism_is_exactly_the_hooks_that_can_change_epsilon():
    assert set(PRIVACY_HOOKS) == EPSILON_HOOKS
    extra = {"validate", "gradient_evaluations_per_step"}  # refusals and compute, no release
    assert _public_methods(Mechanism) == EPSILON_HOOKS | HOUSEKEEPING | extra
    assert _public_methods(Update) == set(UPDATE_HOOKS) | HOUSEKEEPING
    assert not set(UPDATE_HOOKS) & EPSILON_HOOKS


def test_an_update_cannot_define_a_privacy_hook_nor_a_mechanism_an_update_hook():
    for hook in sorted(EPSILON_HOOKS):
        with pytest.raises(TypeError, match="can change epsilon"):
            type("Sneaky", (Update,), {hook: lambda self, *a: None})
    for hook in UPDATE_HOOKS:
        with pytest.raises(TypeError, match="post-process"):
            type("Misplaced", (Mechanism,), {hook: lambda self, *a: None})


def test_the_method_hands_each_hook_to_its_half():
    calls = []

    def spy(hook):
        def record(self, *args):
            calls.append((type(self).__bases__[0].__name__, hook))
        return record

    mech = type("SpyMechanism", (Mechanism,), {h: spy(h) for h in EPSILON_HOOKS})
    upd = type("SpyUpdate", (Update,), {h: spy(h) for h in UPDATE_HOOKS})
    method = type("Spy", (DPMethod,), {"mechanism_cls": mech, "update_cls": upd})()
    for hook in sorted(EPSILON_HOOKS | set(UPDATE_HOOKS)):
        half = Mechanism if hook in EPSILON_HOOKS else Update
        n_args = len(inspect.signature(getattr(half, hook)).parameters) - 1
        getattr(method, hook)(*[None] * n_args)
    assert sorted(calls) == sorted([("Mechanism", h) for h in EPSILON_HOOKS]
                                   + [("Update", h) for h in UPDATE_HOOKS])


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_method_is_a_mechanism_and_an_update(name):
    cls = get_method(name)
    method = cls()
    assert isinstance(method.mechanism, Mechanism) and isinstance(method.updater, Update)
    assert isinstance(method.updater.mechanism, MechanismView)  # read-only: no assignment
    assert object.__getattribute__(method.updater.mechanism, "_mechanism") is method.mechanism
    assert method.mechanism.settings is method.settings is method.updater.settings
    # no hook is written on the method class itself: a review reads the mechanism only
    own = {n for klass in cls.__mro__ if klass is not DPMethod and issubclass(klass, DPMethod)
           for n in vars(klass)}
    assert not own & (EPSILON_HOOKS | set(UPDATE_HOOKS)), name


def test_fiber_composes_disk_mechanism_and_the_noise_corrected_adam_update():
    assert FIBER.__bases__ == (DPMethod,)
    others = {get_method(n) for n in method_names()} - {FIBER}
    assert not others & set(FIBER.__mro__)  # neither DiSK's nor DP-AdamBC's method class
    assert not issubclass(FIBER, (DiSK, DPAdamBC))
    assert FIBER.mechanism_cls is DiSK.mechanism_cls is TwoPointObservation
    assert issubclass(FIBER.update_cls, NoiseCorrectedAdam)
    assert DPAdamBC.update_cls is NoiseCorrectedAdam


def test_the_checkpoint_holds_both_halves_in_one_layout():
    method = set_up(FIBER(optimizer=lambda p: AdamBC(p, lr=1e-3)), params_like())
    for t in range(2):
        c = ctx(step=t, noise_std=0.1)
        method.evaluation_points(c)
        post_release(method, [torch.ones_like(p) for p in method.params], c)
    state = method.state_dict()
    assert list(state) == ["optimizer", "extra"]
    assert list(state["extra"]) == ["previous_params", "filtered", "residual"]
    fresh = set_up(FIBER(optimizer=lambda p: AdamBC(p, lr=1e-3)), params_like())
    fresh.load_state_dict(state)
    for a, b in zip(fresh.mechanism.previous_params, method.mechanism.previous_params):
        assert torch.equal(a, b)
    for a, b in zip(fresh.updater.residual, method.updater.residual):
        assert torch.equal(a, b)
