"""TESTS ONLY: mechanisms broken on purpose, so that an audit has something to catch.

``audit.break_mechanism`` (``conf/audit/*.yaml``) makes a run release without its noise or
without its clipping while the loop still accounts the planned mechanism and reports the
planned epsilon; the one-run audit must then find epsilon_lower above the claim. Each break
is a wrapper, never a patch of a running object:

* ``noise``: the method's record with its mechanism class wrapped (``without_noise``): a
  ``Mechanism`` subclass whose noise shaper maps the i.i.d. noise, drawn at the planned
  scale, to zero; every other hook is the wrapped mechanism's.
* ``clipping``: the mechanism is unchanged, but the audit's engine wrapper sums the
  *unclipped* per-example gradients while reporting the clip factors the mechanism asked for
  to the loop's sensitivity check (``unclipped_sum``), a release that lies to the check; the
  check itself cannot be turned off. Under ``privacy.unit=user`` (ULS) it breaks the
  per-user clip instead: each example is clipped and the user's clipped examples summed, so
  a user of k records contributes up to k C, while the check is handed the true per-user
  norms and factors (``per_user_clip_broken``).
* ``cap`` (``privacy.unit=user`` with ELS only): the per-user cap is not applied to the
  canary users: each holds ``CAP_BREAK_FACTOR`` times k records, every one sampled and
  clipped as an example, while the accountant composes the mixture of Gaussians of a user of
  at most k (``audit/canaries.py``); a loop whose cap let a user through unbounded.

Membership inference (``mia.break_noise_scale``) scales the released noise instead
(``noise_scaled``: the mechanism's own noise shaper first, then the factor).

Every break marks the run's record: ``DPMethod.broken_on_purpose``, written to
``results.json`` as ``broken_on_purpose``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from dpbench.methods.base import DPMethod, Mechanism, NoiseShaper, RunInfo
from dpbench.training.engine.materialised import clip_materialised
from dpbench.training.engine.per_user import clip_per_user
from dpbench.training.engine.protocol import ClippedSum

#: the parts a test can break: none, the noise, the clipping, ELS's per-user cap
BREAKS = ("none", "noise", "clipping", "cap")
#: ``cap``: how many times k records each canary user holds
CAP_BREAK_FACTOR = 8


class ZeroNoise:
    """The noise shape of a mechanism broken by ``noise``: nothing of the draw is released."""

    def __call__(self, noise: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.zeros_like(n) for n in noise]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any], device: Any = None) -> None:
        pass


def without_noise(mechanism_cls: type[Mechanism]) -> type[Mechanism]:
    """Return ``mechanism_cls`` with its released noise shaped to zero (every other hook is
    the wrapped class's, so sampling, clipping and accounting are unchanged)."""

    def noise_shaper(self: Mechanism, info: RunInfo) -> NoiseShaper:
        return ZeroNoise()

    return type(f"{mechanism_cls.__name__}WithoutNoise", (mechanism_cls,),
                {"noise_shaper": noise_shaper, "__doc__": "TESTS ONLY: "
                 f"{mechanism_cls.__name__} releasing no noise (audit.break_mechanism=noise)."})


class ScaledNoise:
    """The noise shape of a mechanism whose released noise is scaled by ``scale`` (after the
    wrapped mechanism's own shaper, if any)."""

    def __init__(self, inner: NoiseShaper | None, scale: float) -> None:
        self.inner, self.scale = inner, scale

    def __call__(self, noise: list[torch.Tensor]) -> list[torch.Tensor]:
        shaped = self.inner(noise) if self.inner is not None else noise
        return [z * self.scale for z in shaped]

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict() if self.inner is not None else {}

    def load_state_dict(self, state: dict[str, Any], device: Any = None) -> None:
        if self.inner is not None:
            self.inner.load_state_dict(state, device)


def noise_scaled(method: DPMethod, scale: float) -> DPMethod:
    """Return ``method``'s record whose released noise is multiplied by ``scale`` (a
    ``Mechanism`` subclass; the loop still accounts the planned mechanism), marked."""
    mechanism_cls = method.mechanism_cls

    def noise_shaper(self: Mechanism, info: RunInfo) -> NoiseShaper:
        return ScaledNoise(mechanism_cls.noise_shaper(self, info), scale)

    scaled = type(f"{mechanism_cls.__name__}WithScaledNoise", (mechanism_cls,),
                  {"noise_shaper": noise_shaper, "__doc__": "TESTS ONLY: "
                   f"{mechanism_cls.__name__} releasing its noise times {scale}."})
    return dataclasses.replace(method, mechanism_cls=scaled, broken_on_purpose=(
        f"mia.break_noise_scale={scale}: the released noise scaled by {scale} while claiming "
        "the planned epsilon (a test of the attack's warnings; not a private run)"))


def broken(method: DPMethod, part: str) -> DPMethod:
    """Return ``method``'s record broken in ``part`` (``BREAKS``) and marked as such; the
    record itself for ``none``. ``clipping`` is carried out by the engine wrapper
    (``unclipped_sum``); the record is marked here."""
    if part == "none":
        return method
    if part not in BREAKS:
        raise ValueError(f"unknown break {part!r}; one of {BREAKS}")
    mechanism_cls = without_noise(method.mechanism_cls) if part == "noise" else \
        method.mechanism_cls
    what = (f"each canary user held {CAP_BREAK_FACTOR} times privacy.max_examples_per_user "
            "records" if part == "cap" else f"the release ran without its {part}")
    return dataclasses.replace(
        method, mechanism_cls=mechanism_cls, broken_on_purpose=(
            f"audit.break_mechanism={part}: {what} while claiming the planned epsilon (a test "
            "of the audit; not a private run)"))


def unclipped_sum(per_example, params, names, loss_fn, batch, points, factors_fn,
                  observe=None) -> ClippedSum:
    """Return the materialised path's answer with the *unclipped* sums and the factors the
    mechanism asked for (``audit.break_mechanism=clipping``: a release that lies to the
    loop's sensitivity check)."""
    out = clip_materialised(per_example, params, names, loss_fn, batch, points,
                            torch.ones_like, observe)
    return out._replace(factors=factors_fn(out.norms) * out.kept.to(out.norms.device))


def per_user_clip_broken(per_example, params, loss_fn, batch, users, points, factors_fn
                         ) -> ClippedSum:
    """Return the per-user path's answer with the sums of a broken per-user clip (each
    example clipped, then summed per user) and the norms and factors of the true one
    (``audit.break_mechanism=clipping`` under privacy.unit=user: a release that lies to the
    loop's sensitivity check)."""
    good = clip_per_user(per_example, params, loss_fn, batch, users, points, factors_fn)
    bad = clip_per_user(per_example, params, loss_fn, batch, users, points, factors_fn,
                        broken_sum_after_clip=True)
    return good._replace(sums=bad.sums)
