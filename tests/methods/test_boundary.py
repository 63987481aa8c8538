"""The privacy boundary by construction: an update reaches neither its mechanism, nor the noise
stream, nor the training data, by any attribute path; the loop never looks a hook up on the
method; no switch turns the release's sensitivity check off (docs/privacy-review.md)."""

from __future__ import annotations

import dataclasses
import functools
import gc
import inspect
import json
import sys
import types
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from dpbench.data.base import TaskData
from dpbench.experiment import build_method, build_trainer
from dpbench.methods import METHODS, get_method
from dpbench.methods.base import Update
from dpbench.methods.hooks import UPDATE_HOOKS
from dpbench.spec import build_spec
from dpbench.tasks.base import Task
from dpbench.training.loop import Callback, Trainer
from dpbench.training.step import clipped_aggregate, private_release
from tests.helpers.config import compose_config
from tests.helpers.method_matrix import method_overrides

pytestmark = pytest.mark.integration  # whole runs or processes: make test, not test-quick

REPO = Path(__file__).resolve().parents[2]
BUILTIN = [n for n in METHODS.builtin_names()]
#: what an update's hooks and constructor may be handed: recorded on the update itself
HANDED = "_handed_for_test"
#: leaves: nothing of a run lies behind them
ATOMS = (str, bytes, int, float, bool, complex, type(None), torch.device, torch.dtype, type,
         types.ModuleType, types.CodeType, types.BuiltinFunctionType, types.FrameType)


def _module_dicts() -> set[int]:
    return {id(vars(m)) for m in list(sys.modules.values()) if m is not None}


def _edges(obj: object, module_dicts: set[int]) -> list[object]:
    """Return what ``obj`` leads to: its ``__dict__``, slots and dataclass fields, container
    items, what a callable closes over (cells, ``__self__``, ``__func__``, ``__wrapped__``,
    defaults, a partial's function and arguments), and its ``gc.get_referents`` (module
    globals aside: they hold what any code can import, not this run's objects)."""
    out: list[object] = []
    if isinstance(obj, Mapping):
        out += [*obj.keys(), *obj.values()]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        out += list(obj)
    if dataclasses.is_dataclass(obj):
        out += [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
    if hasattr(obj, "__dict__") and not isinstance(obj, ATOMS):
        out += list(vars(obj).values())
    for klass in type(obj).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if isinstance(slot, str) and hasattr(obj, slot):
                out.append(getattr(obj, slot))
    if callable(obj):
        for name in ("__self__", "__func__", "__wrapped__", "__defaults__", "__kwdefaults__"):
            out.append(getattr(obj, name, None))
        out += [c.cell_contents for c in (getattr(obj, "__closure__", None) or ())
                if c.cell_contents is not c]
        if isinstance(obj, functools.partial):
            out += [obj.func, *obj.args, *obj.keywords.values()]
    out += [r for r in gc.get_referents(obj) if id(r) not in module_dicts]
    return out


def _reachable(*roots: object, depth: int = 12) -> dict[int, object]:
    """Return every object reachable from ``roots`` along ``_edges``."""
    module_dicts = _module_dicts()
    seen: dict[int, object] = {}
    frontier = list(roots)
    for _ in range(depth):
        nxt = []
        for obj in frontier:
            if id(obj) in seen or isinstance(obj, ATOMS):
                continue
            seen[id(obj)] = obj
            nxt += _edges(obj, module_dicts)
        frontier = nxt
    return seen


def _recording(update_cls: type[Update]) -> type[Update]:
    """Return ``update_cls`` recording every argument its constructor and hooks are handed
    (a subclass: nothing is patched)."""

    def init(self, *args):
        self.__dict__[HANDED] = [args]
        update_cls.__init__(self, *args)

    def wrap(name):
        base = getattr(update_cls, name)

        def hook(self, *args):
            self.__dict__[HANDED].append(args)
            return base(self, *args)
        return hook

    hooks = {*UPDATE_HOOKS, "setup", "load_state_dict"}
    return type(f"Recording{update_cls.__name__}", (update_cls,),
                {"__init__": init, **{h: wrap(h) for h in hooks}})


def _forbidden(trainer: Trainer) -> dict[str, object]:
    """What no update may reach: its mechanism, the noise stream, the data and the task."""
    data = trainer.data
    out = {"mechanism": trainer.mechanism, "noise stream": trainer.noise_generator,
           "task": trainer.task, "task data": data, "training set": data.train,
           "training loader": trainer.train_loader, "engine": trainer.engine}
    for i, t in enumerate(getattr(data.train, "tensors", ()) or ()):
        out[f"training tensor {i}"] = t
    return {k: v for k, v in out.items() if v is not None}


@pytest.mark.parametrize("name", BUILTIN)
def test_an_update_reaches_neither_its_mechanism_nor_the_noise_nor_the_data(name):
    """Every value an update is handed in a whole run (constructor, set-up, every hook,
    evaluation) and the update itself: no attribute path to what it must not see."""
    cfg = compose_config(*method_overrides(name), "trainer.eval_every_steps=2")
    spec = build_spec(cfg)
    method = build_method(cfg)
    recording = dataclasses.replace(method, update_cls=_recording(method.update_cls))
    from dpbench.experiment import build

    trainer = build(spec, None, make_trainer=lambda **kw: Trainer(
        **{**kw, "method": recording}))
    trainer.fit()
    update = trainer.update
    handed = update.__dict__[HANDED]
    assert len(handed) > 3 and any(args for args in handed[1:])  # the hooks did run
    found = _reachable(update, *handed)
    reached = [k for k, v in _forbidden(trainer).items() if id(v) in found]
    assert reached == [], f"{name}: the update reaches {reached}"
    assert not any(isinstance(o, (TaskData, Task)) for o in found.values())


class _Subscriber(Callback):
    """Keeps everything the loop hands its callbacks."""

    def __init__(self) -> None:
        self.handed: list[tuple] = []

    def __getattribute__(self, name):
        if name.startswith("on_"):
            return lambda *args: object.__getattribute__(self, "handed").append((name, args))
        return object.__getattribute__(self, name)


@pytest.mark.parametrize("name", ["adaclip", "dp_ivon"])
def test_a_callback_reaches_neither_the_noise_nor_the_data_nor_a_half(name):
    """Every event's ``LoopView`` and arguments: no path to the noise stream, the data, the
    task, the model, the engine or either half of the method (only values and weights)."""
    subscriber = _Subscriber()
    cfg = compose_config(*method_overrides(name), "trainer.eval_every_steps=2")
    trainer = build_trainer(cfg, None, [subscriber])
    trainer.fit()
    events = {event for event, _ in subscriber.handed}
    assert events == {"on_run_start", "on_step_start", "on_release", "on_step_end",
                      "on_epoch_end", "on_run_end"}
    found = _reachable(*[args for _, args in subscriber.handed])
    forbidden = {**_forbidden(trainer), "update": trainer.update, "model": trainer.model,
                 "trainer": trainer}
    reached = [k for k, v in forbidden.items() if id(v) in found]
    assert reached == [], f"{name}: a callback reaches {reached}"


def test_the_reachability_check_sees_a_closure_and_a_slot():
    """A negative control: the walk finds what hides in a closure, a slot or a partial."""

    class Slotted:
        __slots__ = ("_hidden",)

    secret, slotted = object(), Slotted()
    slotted._hidden = secret
    assert id(secret) in _reachable(lambda: secret)
    assert id(secret) in _reachable(slotted)
    assert id(secret) in _reachable(functools.partial(print, secret))
    assert id(secret) in _reachable(types.SimpleNamespace(method=(lambda: secret).__call__))


def test_the_step_context_holds_no_generator_of_the_release():
    from dpbench.methods.context import StepContext

    fields = dataclasses.fields(StepContext)
    assert [f.name for f in fields if "generator" in f.name] == ["method_generator"]
    params = inspect.signature(Update.evaluate).parameters
    assert list(params) == ["self", "held_out"]  # no model, no task, no loader


def test_the_held_out_evaluation_gives_the_test_metrics():
    trainer = build_trainer(compose_config(*method_overrides("dpsgd")), None)
    got = trainer.evaluate()
    want = trainer.task.evaluate(trainer.model, trainer.test_loader, trainer.device)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)  # NaN bins
    held = trainer.held_out()
    assert [f.name for f in dataclasses.fields(held)] == ["metrics", "averaged"]
    assert not any(callable(v) for v in vars(held).values())


class _Spy:
    calls = 0

    def __call__(self, *args):
        _Spy.calls += 1
        raise AssertionError("the loop looked a hook up on the method record")


def test_a_hook_forced_onto_the_method_record_is_never_called():
    """The loop calls ``mechanism.<hook>`` and ``update.<hook>`` directly: even a hook forced
    onto the frozen record (``object.__setattr__``) is never looked up."""
    cfg = compose_config(*method_overrides("dpsgd"))
    spec = build_spec(cfg)
    method = build_method(cfg)
    for hook in ("clip_factors", "sensitivity", "noise_shaper", "evaluation_points", "update",
                 "postprocess", "evaluate"):
        object.__setattr__(method, hook, _Spy())
    from dpbench.experiment import build

    forced = build(spec, None, make_trainer=lambda **kw: Trainer(**{**kw, "method": method}))
    plain = build(spec, None)
    a, b = forced.fit(), plain.fit()
    assert _Spy.calls == 0
    assert a["privacy_ledger"] == b["privacy_ledger"]
    assert json.dumps(a["metrics"], sort_keys=True) == json.dumps(b["metrics"], sort_keys=True)


def test_no_production_path_turns_the_sensitivity_check_off():
    for fn in (Trainer.__init__, private_release, clipped_aggregate):
        assert not [p for p in inspect.signature(fn).parameters if "check" in p], fn
    offenders = [str(p.relative_to(REPO)) for p in sorted((REPO / "dpbench").rglob("*.py"))
                 if "check_sensitivity" in p.read_text()]
    assert offenders == []


def test_settings_are_frozen():
    method = get_method("disk").configured()
    with pytest.raises(dataclasses.FrozenInstanceError):
        method.settings.kappa = 1.0  # type: ignore[misc]
    halves = method.halves()
    assert halves.mechanism.settings is halves.update.settings is method.settings
