"""The update: the half of a method that post-processes what the mechanism released.

Every hook here sees released values only (the noisy gradient, the noisy extra queries, the
step context), so nothing in an update can change epsilon: it is post-processing. The
defaults apply the YAML's optimiser to the released gradient:

==============================  ===============================================================
``postprocess(grads, ctx)``      filters, denoising of the released gradient: unchanged
``update(grads, ctx)``           the optimiser step on the (post-processed) gradient
``after_step(released, ctx)``    use of the noisy extra queries: nothing
``public_state()``               what the mechanism's ``advance`` may read: nothing
``evaluate(held_out, model)``    the test metrics: the task's, at the current weights
``step_metrics()``               per-step diagnostics to log: none
==============================  ===============================================================

An update reads its mechanism through ``MechanismView`` (``self.mechanism``): every public
attribute can be read, none can be assigned or deleted, and the mechanism's own state-changing
calls (``advance``, ``setup``, ``load_state_dict``) are not reachable. The mechanism's moving
parameters (the adaptive threshold, the previous weights, the posterior scale) change in its
``advance`` alone, from released values and ``public_state()``. An update may not define a
mechanism hook (``PRIVACY_HOOKS``): defining one raises at class creation.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch import nn

from dpbench.errors import PrivacyError
from dpbench.methods.context import HeldOut, RunInfo, StepContext
from dpbench.methods.hooks import PRIVACY_HOOKS, UPDATE_HOOKS, refuse_hooks
from dpbench.methods.mechanism import Mechanism

__all__ = ["UPDATE_HOOKS", "MechanismView", "OptimizerFactory", "Update"]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

#: the mechanism's calls that change its state: the loop's and the method's, not the update's
_STATE_CHANGING = frozenset({"advance", "setup", "load_state_dict"})


class MechanismView:
    """A read-only view of a mechanism: what an update may know of it.

    Reading an attribute returns the mechanism's (a list as a tuple, a dict as a read-only
    mapping, a NumPy array as a read-only view, a dataclass as a copy); assigning or
    deleting one raises ``AttributeError``, and so does reaching the mechanism's
    state-changing calls (``advance``, ``setup``, ``load_state_dict``). A tensor's in-place
    change is caught by ``mechanism_unchanged`` instead."""

    __slots__ = ("_mechanism",)

    def __init__(self, mechanism: Mechanism) -> None:
        object.__setattr__(self, "_mechanism", mechanism)

    def __getattr__(self, name: str) -> Any:
        if name in _STATE_CHANGING:
            raise AttributeError(f"an update cannot call its mechanism's {name!r}: the "
                                 "mechanism's state changes in its advance hook alone")
        value = getattr(object.__getattribute__(self, "_mechanism"), name)
        if isinstance(value, list):
            return tuple(value)
        if isinstance(value, dict):
            return MappingProxyType(value)
        if isinstance(value, np.ndarray):  # no version counter: hand out a read-only view
            value = value.view()
            value.flags.writeable = False
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = copy.copy(value)  # a settings record: an edit lands in the copy
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"an update cannot set its mechanism's {name!r}: the mechanism's "
                             "state changes in its advance hook alone, from released values")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"an update cannot delete its mechanism's {name!r}")

    def __repr__(self) -> str:
        return f"MechanismView({object.__getattribute__(self, '_mechanism')!r})"


def _mechanism_tensors(mechanism: Mechanism) -> list[torch.Tensor]:
    """Return the tensors a mechanism holds: its attributes, and those in its lists, tuples
    and dicts; the trainable parameters aside (changing them is the update's job)."""
    found: list[torch.Tensor] = []
    todo, seen = list(vars(mechanism).values()), set()
    while todo:
        value = todo.pop()
        if isinstance(value, nn.Parameter):
            continue
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple, Mapping)) and id(value) not in seen:
            seen.add(id(value))
            todo.extend(value.values() if isinstance(value, Mapping) else value)
    return found


@contextmanager
def mechanism_unchanged(mechanism: Mechanism, during: str) -> Iterator[None]:
    """Raise ``PrivacyError`` if the update code run inside changed one of the mechanism's
    tensors in place (``t.add_()`` on a tensor the view handed out): every in-place write
    bumps a tensor's version counter, so the mechanism's state changes in ``advance`` alone."""
    held = [(tensor, tensor._version) for tensor in _mechanism_tensors(mechanism)]
    yield
    if any(tensor._version != version for tensor, version in held):
        raise PrivacyError(f"{type(mechanism).__name__}: the update changed the mechanism's "
                           f"state in place during {during}; a mechanism's moving parameters "
                           "change in its advance hook alone, from released values")


class Update:
    """The YAML's optimiser on the released gradient (SGD with lr 0.1 when none is given).

    ``settings`` is the method's checked settings dict (shared with its mechanism), ``name``
    the method's (for error messages) and ``optimizer`` a Hydra ``_partial_`` factory;
    ``self.mechanism`` is a read-only view of ``mechanism`` (``MechanismView``).
    """

    def __init__(self, name: str, settings: Mapping[str, Any], mechanism: Mechanism,
                 optimizer: OptimizerFactory | None = None) -> None:
        self.name = name
        self.settings = settings
        self.mechanism = MechanismView(mechanism)
        self.optimizer_factory = optimizer or (lambda p: torch.optim.SGD(p, lr=0.1))
        self.params: list[nn.Parameter] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self.info: RunInfo | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        refuse_hooks(cls, PRIVACY_HOOKS, "can change epsilon; they belong to the method's "
                     "Mechanism, not to its Update")

    # ---- housekeeping --------------------------------------------------------------------
    def setup(self, params: list[nn.Parameter], info: RunInfo) -> None:
        """Build the optimiser and any state over the trainable parameters."""
        self.params = params
        self.info = info
        self.optimizer = self.optimizer_factory(params)

    def summary(self) -> dict[str, Any]:
        """Return facts about the update for results.json."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps beyond the optimiser's (filters, counters)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s entries (``state`` may hold the mechanism's too)."""

    # ---- stage 7: post-processing --------------------------------------------------------
    def postprocess(self, grads: list[torch.Tensor], ctx: StepContext) -> list[torch.Tensor]:
        """Return the gradient the optimiser consumes (the released one by default)."""
        return grads

    # ---- stage 8: the optimiser step -----------------------------------------------------
    def update(self, grads: list[torch.Tensor], ctx: StepContext) -> None:
        """Apply the optimiser to ``grads``."""
        assert self.optimizer is not None
        for p, g in zip(self.params, grads):
            p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # ---- stage 9 and evaluation ----------------------------------------------------------
    def after_step(self, released: dict[str, torch.Tensor], ctx: StepContext) -> None:
        """Use the step's noisy extra queries (``released``: name -> noisy sum)."""

    def public_state(self) -> dict[str, Any]:
        """Return what the mechanism's ``advance`` may read of the update after its step
        (post-processing of released values, e.g. IVON's posterior scale): nothing here."""
        return {}

    def evaluate(self, held_out: HeldOut, model: nn.Module) -> dict:
        """Return test metrics; default: the task's held-out metrics at the current weights
        (``held_out`` holds the test evaluation only: no training data)."""
        return held_out.metrics(model)

    def step_metrics(self) -> dict[str, float]:
        """Return per-step diagnostics to log (e.g. the current clip threshold)."""
        return {}
