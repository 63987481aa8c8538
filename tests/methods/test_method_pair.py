"""A method is a frozen record naming a mechanism (every hook that can change epsilon) and an
update (post-processing); the loop calls each half directly (docs/privacy-review.md)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dpbench.methods import METHODS, get_method, method_names, register_method
from dpbench.methods.base import DPMethod, Halves, Mechanism, Update
from dpbench.methods.disk import DISK, TwoPointObservation
from dpbench.methods.dpadam_bc import DPADAM_BC, AdamBC, NoiseCorrectedAdam
from dpbench.methods.fiber import FIBER
from dpbench.methods.mechanism import PRIVACY_HOOKS
from dpbench.methods.update import UPDATE_HOOKS
from tests.helpers.method_steps import ctx, params_like, post_release, set_up

#: the hooks whose result enters the release or the accountant: sampling, the points where
#: gradients are taken, clipping and its bound, the noise multiplier and shape, extra queries,
#: and the one writer of the mechanism's moving parameters (``advance``)
EPSILON_HOOKS = {"participation_bands", "evaluation_points", "clip_factors", "sensitivity",
                 "gradient_noise_multiplier", "extra_queries", "noise_shaper", "advance"}
#: what each half keeps besides its hooks: set-up, facts for results.json and the per-step
#: log, checkpoint state
HOUSEKEEPING = {"setup", "summary", "step_metrics", "state_dict", "load_state_dict"}
#: the record's fields: what a method is
RECORD = ["name", "settings", "mechanism_cls", "update_cls", "private", "tasks",
          "needs_per_example_grads", "configure_model", "optimizer", "broken_on_purpose"]
BUILTIN = [n for n in method_names() if n in METHODS.builtin_names()]


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
            type("Misplaced", (Update,), {hook: lambda self, *a: None})
    for hook in UPDATE_HOOKS:
        with pytest.raises(TypeError, match="post-process"):
            type("Misplaced", (Mechanism,), {hook: lambda self, *a: None})


def test_a_method_is_a_frozen_record_that_defines_no_hook():
    assert [f.name for f in dataclasses.fields(DPMethod)] == RECORD
    assert not set(vars(DPMethod)) & (EPSILON_HOOKS | set(UPDATE_HOOKS))
    method = get_method("dpsgd")
    with pytest.raises(dataclasses.FrozenInstanceError):
        method.clip_factors = lambda norms, ctx: torch.ones_like(norms)  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        method.mechanism_cls = Mechanism  # type: ignore[misc]
    with pytest.raises(TypeError, match="Mechanism subclass"):
        DPMethod("bad", mechanism_cls=Update)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="frozen dataclass"):
        DPMethod("bad", settings={"a": 1})


def test_the_halves_are_built_apart():
    """The update is built from the name, the settings and the optimiser factory alone."""
    halves = FIBER.configured(optimizer=lambda p: AdamBC(p, lr=1e-3)).halves()
    assert isinstance(halves, Halves)
    assert type(halves.mechanism) is TwoPointObservation
    assert isinstance(halves.update, NoiseCorrectedAdam)
    assert halves.mechanism.settings is halves.update.settings is not None
    assert not any(v is halves.mechanism for v in vars(halves.update).values())
    again = FIBER.halves()
    assert again.mechanism is not halves.mechanism and again.update is not halves.update


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_method_is_a_record_of_a_mechanism_and_an_update(name):
    method = get_method(name)
    assert isinstance(method, DPMethod) and method.name == name
    assert issubclass(method.mechanism_cls, Mechanism)
    assert issubclass(method.update_cls, Update)
    halves = method.configured().halves()
    assert isinstance(halves.mechanism, method.mechanism_cls)
    assert isinstance(halves.update, method.update_cls)


def test_registration_takes_records_under_their_own_name():
    with pytest.raises(ValueError, match="already registered"):
        register_method(DPMethod("dpsgd"))
    with pytest.raises(TypeError, match="DPMethod record"):
        METHODS.register("class_test")(type("Old", (), {}))
    with pytest.raises(TypeError, match="named 'other'"):
        METHODS.register("renamed_test")(DPMethod("other"))
    assert "class_test" not in METHODS and "renamed_test" not in METHODS


def test_fiber_composes_disk_mechanism_and_the_noise_corrected_adam_update():
    assert FIBER.mechanism_cls is DISK.mechanism_cls is TwoPointObservation
    assert issubclass(FIBER.update_cls, NoiseCorrectedAdam)
    assert DPADAM_BC.update_cls is NoiseCorrectedAdam


def test_the_checkpoint_holds_both_halves_in_one_layout():
    method = set_up(FIBER.configured(optimizer=lambda p: AdamBC(p, lr=1e-3)), params_like())
    for t in range(2):
        c = ctx(step=t, noise_std=0.1)
        method.mechanism.evaluation_points(c)
        post_release(method, [torch.ones_like(p) for p in method.params], c)
    state = method.state_dict()
    assert list(state) == ["optimizer", "extra"]
    assert list(state["extra"]) == ["previous_params", "filtered", "residual"]
    fresh = set_up(FIBER.configured(optimizer=lambda p: AdamBC(p, lr=1e-3)), params_like())
    fresh.load_state_dict(state)
    for a, b in zip(fresh.mechanism.previous_params, method.mechanism.previous_params):
        assert torch.equal(a, b)
    for a, b in zip(fresh.update.residual, method.update.residual):
        assert torch.equal(a, b)
