"""The privacy boundary as types: what post-processing receives, what a method class may
define, and no switch that turns the release's sensitivity check off (docs/privacy-review.md)."""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from dpbench.data.base import TaskData
from dpbench.methods import METHODS, get_method
from dpbench.methods.base import DPMethod, Mechanism, MechanismView, Update
from dpbench.methods.hooks import PRIVACY_HOOKS, UPDATE_HOOKS
from dpbench.training.loop import Trainer
from dpbench.training.step import clipped_aggregate, private_release
from tests.helpers.config import compose_config
from tests.helpers.method_matrix import method_overrides

pytestmark = pytest.mark.integration  # whole runs or processes: make test, not test-quick

REPO = Path(__file__).resolve().parents[2]


def _reachable(*roots: object, depth: int = 8) -> list[object]:
    """Return every object reachable from ``roots`` through public attributes, dataclass
    fields and container items (what a hook's code reaches without reflection tricks)."""
    seen: dict[int, object] = {}
    frontier = list(roots)
    for _ in range(depth):
        nxt = []
        for obj in frontier:
            if id(obj) in seen or isinstance(obj, (type, str, bytes, int, float, bool,
                                                   torch.Tensor, torch.device)) or obj is None:
                continue
            seen[id(obj)] = obj
            if isinstance(obj, Mapping):
                nxt += list(obj.values())
            elif isinstance(obj, (list, tuple, set, frozenset)):
                nxt += list(obj)
            if isinstance(obj, MechanismView):  # the view reads through to its mechanism
                nxt.append(object.__getattribute__(obj, "_mechanism"))
            if dataclasses.is_dataclass(obj):
                nxt += [getattr(obj, f.name) for f in dataclasses.fields(obj)]
            if hasattr(obj, "__dict__") and not inspect.isroutine(obj):
                nxt += [v for k, v in vars(obj).items() if not k.startswith("_")]
        frontier = nxt
    return list(seen.values())


@pytest.fixture(scope="session")  # once per worker, whatever runs between its users
def trainer():
    from dpbench.experiment import build_trainer

    return build_trainer(compose_config(*method_overrides("dpsgd")), None)


def _what_an_update_receives(trainer):
    ctx = trainer._context()
    ctx.noise_std = trainer.step_plan.released_noise_std(trainer.method.sensitivity(ctx))
    released = {"count": torch.zeros(())}
    return trainer.method.updater, ctx, released, trainer.held_out


def test_an_update_cannot_reach_the_noise_generator(trainer):
    found = _reachable(*_what_an_update_receives(trainer))
    assert not any(o is trainer.noise_generator for o in found)
    assert not any(f.type is torch.Generator or "generator" == f.name
                   for f in dataclasses.fields(type(trainer._context())))


def test_an_update_cannot_reach_the_training_data(trainer):
    found = _reachable(*_what_an_update_receives(trainer))
    assert not any(isinstance(o, TaskData) or o is trainer.data.train for o in found)
    params = inspect.signature(Update.evaluate).parameters
    assert list(params) == ["self", "held_out", "model"]  # no task, no loader


def test_the_held_out_evaluation_gives_the_test_metrics(trainer):
    got = trainer.method.evaluate(trainer.held_out, trainer.model)
    want = trainer.task.evaluate(trainer.model, trainer.test_loader, trainer.device)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)  # NaN bins


@pytest.mark.parametrize("hook", [*PRIVACY_HOOKS, *UPDATE_HOOKS])
def test_a_method_class_defining_a_hook_is_refused(hook):
    with pytest.raises(TypeError, match="belong to the method's"):
        type("Sneaky", (DPMethod,), {hook: lambda self, *a: None})


def test_registration_refuses_a_hook_set_outside_the_mechanism():
    cls = type("LateSneaky", (DPMethod,), {})
    cls.clip_factors = lambda self, norms, ctx: torch.ones_like(norms)  # after class creation
    with pytest.raises(TypeError, match="can change epsilon"):
        METHODS.register("late_sneaky_test")(cls)
    assert "late_sneaky_test" not in METHODS

    class Plugin:  # an entry point that is not even a DPMethod
        def sensitivity(self, ctx):
            return 0.0
    with pytest.raises(TypeError, match="can change epsilon"):
        METHODS.register("plugin_sneaky_test")(Plugin)


def test_the_pair_forwards_each_hook_to_its_half():
    method = get_method("adaclip")()
    assert method.clip_factors.__self__ is method.mechanism
    assert method.postprocess.__self__ is method.updater
    assert not set(vars(DPMethod)) & set(PRIVACY_HOOKS + UPDATE_HOOKS)
    assert issubclass(type(method.mechanism), Mechanism)


def test_settings_are_frozen():
    method = get_method("disk")()
    with pytest.raises(TypeError):
        method.settings["kappa"] = 1.0  # type: ignore[index]
    assert method.mechanism.settings is method.updater.settings is method.settings


def test_no_production_path_turns_the_sensitivity_check_off():
    for fn in (Trainer.__init__, private_release, clipped_aggregate):
        assert not [p for p in inspect.signature(fn).parameters if "check" in p], fn
    offenders = [str(p.relative_to(REPO)) for p in sorted((REPO / "dpbench").rglob("*.py"))
                 if "check_sensitivity" in p.read_text()]
    assert offenders == []
