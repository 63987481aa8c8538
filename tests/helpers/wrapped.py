"""Test doubles are halves: a run whose mechanism or update is a subclass of the method's own,
never an instance patched at run time (the loop calls each half directly)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection
from pathlib import Path

import torch

from dpbench.experiment import build, build_method
from dpbench.spec import build_spec
from dpbench.training.loop import Callback, Trainer

Wrap = Callable[[type], type]


def subclass(cls: type, **members) -> type:
    """Return ``cls`` with ``members`` (hooks) overridden, as a class of its own."""
    return type(f"Wrapped{cls.__name__}", (cls,), members)


def build_wrapped(cfg, run_dir: str | Path | None = None,
                  callbacks: list[Callback] | None = None, *, mechanism: Wrap | None = None,
                  update: Wrap | None = None) -> Trainer:
    """Return the Trainer of ``cfg`` whose method record names ``mechanism(mechanism_cls)``
    and ``update(update_cls)`` (each wrap returns a subclass)."""
    method = build_method(cfg)
    method = dataclasses.replace(
        method,
        mechanism_cls=mechanism(method.mechanism_cls) if mechanism else method.mechanism_cls,
        update_cls=update(method.update_cls) if update else method.update_cls)
    return build(build_spec(cfg), run_dir, callbacks,
                 make_trainer=lambda **kw: Trainer(**{**kw, "method": method}))


def never_applied(update_cls: type) -> type:
    """An update that applies nothing: every release accounted, the weights never move."""
    return subclass(update_cls, update=lambda self, grads, ctx: None)


def poisoned_at(steps: Collection[int]) -> Wrap:
    """Return a wrap whose update turns the first weight NaN after the steps ``steps``."""

    def wrap(update_cls: type) -> type:
        def update(self, grads, ctx):
            update_cls.update(self, grads, ctx)
            if ctx.step in steps:
                with torch.no_grad():
                    self.params[0].fill_(math.nan)
        return subclass(update_cls, update=update)
    return wrap


def unclipped(mechanism_cls: type) -> type:
    """A mechanism that does not clip (its contributions exceed its sensitivity)."""
    return subclass(mechanism_cls, clip_factors=lambda self, norms, ctx: torch.ones_like(norms))
