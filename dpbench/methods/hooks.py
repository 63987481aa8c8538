"""The names of a method's hooks, split by the half they belong to, and the check that keeps
them apart: the loop calls each hook on its own half only (``mechanism.<hook>``,
``update.<hook>``), so a hook written in the other half would never be called. This check
catches that mistake when the class is created; it is not what keeps the halves apart (the
loop is: docs/privacy-review.md)."""

from __future__ import annotations

from collections.abc import Sequence

#: the hooks that can change epsilon: only a ``Mechanism`` defines them
PRIVACY_HOOKS = ("participation_bands", "evaluation_points", "clip_factors", "sensitivity",
                 "gradient_noise_multiplier", "extra_queries", "noise_shaper", "advance")

#: the hooks that post-process the release: only an ``Update`` defines them
UPDATE_HOOKS = ("postprocess", "update", "after_step", "public_state", "evaluate",
                "evaluation_samples", "evaluation_offsets")


def refuse_hooks(cls: type, hooks: Sequence[str], reason: str) -> None:
    """Raise ``TypeError`` if ``cls`` itself defines one of ``hooks``."""
    stray = sorted(set(vars(cls)) & set(hooks))
    if stray:
        raise TypeError(f"{cls.__name__}: {stray} {reason}")
