"""The names of a method's hooks, split by the half they belong to, and the check that keeps
them apart (a hook in the wrong half would never be called)."""

from __future__ import annotations

from collections.abc import Sequence

#: the hooks that can change epsilon: only a ``Mechanism`` defines them
PRIVACY_HOOKS = ("participation_bands", "evaluation_points", "clip_factors", "sensitivity",
                 "gradient_noise_multiplier", "extra_queries", "noise_shaper", "advance")

#: the hooks that post-process the release: only an ``Update`` defines them
UPDATE_HOOKS = ("postprocess", "update", "after_step", "public_state", "evaluate",
                "step_metrics")


def refuse_hooks(cls: type, hooks: Sequence[str], reason: str) -> None:
    """Raise ``TypeError`` if ``cls`` itself defines one of ``hooks``."""
    stray = sorted(set(vars(cls)) & set(hooks))
    if stray:
        raise TypeError(f"{cls.__name__}: {stray} {reason}")
