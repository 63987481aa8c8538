"""Stages 7-10 of a step: post-processing and update of a release, then the mechanism's advance.

Everything here reads released (noisy) values only, so it cannot change epsilon
(docs/adding-a-method.md). A release, its post-processing or the updated parameters that are
not finite are skipped (``trainer.nonfinite=skip``: the model and method state are put back)
or stop the run; a non-finite *example* never gets here, it was dropped before the noise.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from types import MappingProxyType
from typing import Any

import torch

from dpbench.errors import TrainingDiverged
from dpbench.methods.base import DPMethod, Released, StepContext, Update
from dpbench.training.step import Release


def all_finite(*groups: Iterable[torch.Tensor]) -> bool:
    """Return whether every tensor in ``groups`` (iterables of tensors) is finite.

    One check for all of them: the largest |x| over every floating tensor (torch's
    ``get_total_norm`` of order inf) is finite exactly when each entry is, since a maximum
    propagates NaN and cannot overflow; one device sync instead of one per tensor.
    """
    tensors = [t for group in groups for t in group
               if t.numel() and (t.is_floating_point() or t.is_complex())]
    if not tensors:
        return True
    return bool(torch.isfinite(torch.nn.utils.get_total_norm(tensors, math.inf)))


def apply_release(method: DPMethod, params: Sequence[torch.nn.Parameter], release: Release,
                  ctx: StepContext, skip: bool, epoch: int = 0) -> bool:
    """Post-process and apply ``release``; return False if it was not finite and skipped.

    With ``skip`` the parameters and the method's state are restored to what they were
    before a step that was not finite; without it the run stops (``TrainingDiverged``).
    """
    saved = _snapshot(method, params) if skip else None
    ok = all_finite(release.grads, release.noisy_extras.values())
    if ok:
        postprocess = method.postprocess
        grads = postprocess(release.grads, ctx)
        # the default post-processing returns the release as it is: checked above already
        ok = getattr(postprocess, "__func__", None) is Update.postprocess or all_finite(grads)
    if ok:
        method.update(grads, ctx)
        method.after_step(release.noisy_extras, ctx)
        # the mechanism's moving parameters: from the released values and the update's
        # public state only (the hook's argument holds nothing else)
        method.advance(Released(step=ctx.step, extras=MappingProxyType(release.noisy_extras),
                                grads=tuple(release.grads),
                                public=MappingProxyType(method.public_state())))
        ok = all_finite(params)
    if not ok and not skip:
        raise TrainingDiverged(
            f"non-finite released gradient or update at step {ctx.step} (epoch {epoch}); the "
            "last good checkpoint is kept. Lower the learning rate, or set "
            "trainer.nonfinite=skip to skip such updates (they stay accounted)")
    if not ok:
        _restore(method, params, saved)
    return ok


def _snapshot(method: DPMethod, params: Sequence[torch.nn.Parameter]) -> dict[str, Any]:
    return {"params": [p.detach().clone() for p in params],
            "method": copy.deepcopy(method.state_dict())}


def _restore(method: DPMethod, params: Sequence[torch.nn.Parameter],
             saved: dict[str, Any]) -> None:
    with torch.no_grad():
        for p, v in zip(params, saved["params"]):
            p.copy_(v)
    method.load_state_dict(saved["method"])
