"""Choose and build the per-example engine for ``trainer.grad_sample_mode`` (``auto``: fastest).

``auto`` (the default) takes book-keeping (``bk``: one backward per evaluation point, clipped
sums formed directly) when the method needs only per-example norms and clip factors, of one
point or of a combination of several (DiSK, FIBER, IVON with several samples: the rules form
the combination's norm with its cross terms), and every trainable layer has an exact
book-keeping rule (under per-user clipping, one with a per-user norm too); otherwise Opacus
``hooks`` (materialised per-example gradients), which
gradient diagnostics and the audit's canaries need. See docs/engine.md.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from dpbench.errors import ConfigError
from dpbench.training.engine import ghost, materialised  # noqa: F401 - they register engines
from dpbench.training.engine.bookkeeping import bk_per_user_unsupported, bk_unsupported
from dpbench.training.engine.check import EngineCheck, EngineVerifier
from dpbench.training.engine.per_user import per_user_refusal
from dpbench.training.engine.protocol import ENGINES, Engine

log = logging.getLogger(__name__)

# ENGINES (``protocol``): the engine of each resolved ``trainer.grad_sample_mode``, registered
# by ``@register_engine`` in the modules imported above; ``auto`` chooses one of them

#: what ``auto`` tries after its first choice, in order, when the per-run check rejects it
AUTO_FALLBACKS = ("hooks", "functorch")


def needs_materialised(method: Any, task: Any, materialise: bool = False) -> str | None:
    """Return why this run needs materialised per-example gradients, or None."""
    if method.needs_per_example_grads:
        return f"method {method.name!r} reads materialised per-example gradients"
    if getattr(task, "observes_gradients", False) and not getattr(task, "observes_norms_only",
                                                                  False):
        return "the task observes per-example gradients (diagnostics)"
    if materialise:
        return "the trainer reads per-example gradients (audit canaries)"
    return None


def combines_points(method: Any) -> bool:
    """Return whether ``method`` combines per-example gradients of several evaluation points
    before clipping (DiSK, FIBER, IVON with several samples)."""
    return method.gradient_evaluations_per_step() > 1


def refusal(mode: str, method: Any, task: Any, materialise: bool = False,
            precision: str = "32-true", per_user: bool = False) -> str | None:
    """Return the one-line refusal of the engine of ``mode`` for this run, or None.

    Read from the engine's declared capabilities (the protocol's class attributes): whether
    it materialises per-example gradients, takes several evaluation points, and hands its
    quantities over in float32 under mixed precision.
    """
    engine, need = ENGINES.get(mode), needs_materialised(method, task, materialise)
    name = f"trainer.grad_sample_mode={mode}"
    if per_user and not engine.per_user_supported:
        return per_user_refusal(mode)
    if need is not None and not engine.materialises:
        return (f"{name} forms clipped sums only, but {need}: use "
                "trainer.grad_sample_mode=hooks (or auto)")
    if combines_points(method) and not engine.combines_points_supported:
        return (f"{name} forms the clipped sum of one evaluation point, but method "
                f"{method.name!r} combines per-example gradients of "
                f"{method.gradient_evaluations_per_step()} evaluation points: use "
                "trainer.grad_sample_mode=bk, hooks or auto")
    if precision != "32-true" and not engine.float32_handover:
        return (f"trainer.precision={precision} needs an engine that hands its per-example "
                f"quantities over in float32 (bk, hooks, functorch or auto), not {name}")
    return None


def choose_grad_sample_mode(requested: str, model: nn.Module, method: Any, task: Any,
                            materialise: bool = False, precision: str = "32-true",
                            per_user: bool = False) -> str:
    """Return the engine mode to run: ``requested``, or for ``auto`` bk where exact, else hooks.

    Raises ``ConfigError`` when the requested engine cannot run this method and task.
    """
    if requested != "auto":
        why = refusal(requested, method, task, materialise, precision, per_user)
        if why is not None:
            raise ConfigError(why)
        return requested
    need = needs_materialised(method, task, materialise)
    if need is not None:
        log.info("grad_sample_mode=auto: hooks (%s)", need)
        return "hooks"
    reason = bk_per_user_unsupported(model) if per_user else bk_unsupported(model)
    if reason is not None:
        log.info("grad_sample_mode=auto: hooks (book-keeping unsupported: %s)", reason)
        return "hooks"
    return "bk"


def build_engine(model: nn.Module, mode: str) -> Engine:
    """Return the engine for a resolved ``mode`` (not ``auto``)."""
    return ENGINES.get(mode)(model)


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def build_verified_engine(requested: str, model: nn.Module, method: Any, task: Any,
                          verifier: EngineVerifier, materialise: bool = False,
                          precision: str = "32-true", per_user: bool = False
                          ) -> tuple[Engine, EngineCheck, list[dict]]:
    """Return (engine, its passed check, the engines rejected before it, with why).

    ``verifier`` runs the per-run check (``engine_check.EngineVerifier``); its plain-autograd
    reference is computed on the bare model, before any engine is built. An explicitly
    requested mode is built and checked; a failure refuses the run. ``auto`` tries its first
    choice (bk where its rules apply), then ``hooks``, then ``functorch``, and takes the first
    that builds and passes: a refusal when built, a refusal at the first call (a layer called
    twice, an in-place op after a layer, a layer whose dim 0 is not the example) or a crash
    moves on to the next. None passing refuses the run. All of this happens before any
    release.
    """
    first = choose_grad_sample_mode(requested, model, method, task, materialise, precision,
                                    per_user)
    verifier.prepare()
    rejected: list[dict] = []
    if requested == "auto":
        if first != "bk" and needs_materialised(method, task, materialise) is None:
            rejected.append({"engine": "bk", "reason": bk_per_user_unsupported(model)
                             if per_user else bk_unsupported(model)})
        order = [first, *(m for m in AUTO_FALLBACKS if m != first)]
    else:
        order = [first]
    for mode in order:
        try:
            engine = build_engine(model, mode)
        except Exception as err:  # noqa: BLE001 - Opacus refuses with its own error types
            if requested != "auto" and isinstance(err, ConfigError):
                raise
            rejected.append({"engine": mode, "reason": _one_line(err)})
            continue
        # a method combining several points is checked on a two-point combination too (and
        # again after a resume: the engine remembers it)
        engine.combines_points = combines_points(method)
        engine.per_user = per_user  # privacy.unit=user (ULS): the per-user path is checked too
        check = verifier.check(engine)
        if check.passed:
            rejected = [{"engine": r["engine"], "reason": r["reason"]} for r in rejected]
            for r in rejected:
                log.info("grad_sample_mode=%s: %s rejected (%s)", requested, r["engine"],
                         r["reason"])
            return engine, check, rejected
        engine.close()
        rejected.append({"engine": mode, "reason": check.line(numbers=False), "check": check})
    # the run stops here, before any release: the refusal may say by how much
    reasons = [r["check"].line() if "check" in r else r["reason"] for r in rejected]
    if requested != "auto":
        raise ConfigError(f"trainer.grad_sample_mode={requested} is not exact for this model: "
                          f"{reasons[-1]}; refusing to train (try "
                          "trainer.grad_sample_mode=auto)")
    raise ConfigError("no per-example engine is exact for this model, refusing to train: "
                      + "; ".join(f"{r['engine']}: {why}" for r, why in zip(rejected, reasons)))
