"""What every book-keeping layer rule shares: the calls it reads, the rule's interface, the
registry and the small tensor helpers.

Each rule sees a layer's input activations ``a`` and the gradients ``g`` of the summed loss
with respect to its output (one backward). For example i the weight gradient of a linear
layer is ``G_i = sum_t g_it a_it^T`` (Bu et al., ICML 2023, eq. 2), so

* ghost norm (their eq. 4, Li et al. 2022): ``||G_i||^2 = <a_i a_i^T, g_i g_i^T>_F``, cost
  ``T^2 (d_in + d_out)`` per example;
* instantiation: form ``G_i`` and sum its squares, cost ``T d_in d_out``;

each layer takes the cheaper (book-keeping's hybrid rule, their sec. 3.3). The clipped sum
``sum_i f_i G_i = sum_{i,t} (f_i g_it) a_it^T`` is the layer's ordinary weight gradient with
the output gradients re-weighted by the clip factors f (their eq. 5): one matmul, no second
backward, no B x params tensor.

A rule takes a list of *calls* ``(a, g, state)``: example i's gradient of the layer is the sum
of the calls' terms, ``G_i = sum_c G_i(a_c, g_c)``. One call is the common case; a linear layer
called k times in one forward has k; a method that combines per-example gradients of several
evaluation points before clipping (DiSK, FIBER: ``d_i = w_1 g_i(x) + w_2 g_i(x')``) has one
call per point with its output gradients scaled by the point's weight ``w_k``. The norm of a
sum of calls is then exact without forming ``g_i(x)``: for a linear layer the calls are
concatenated along the token axis, ``d_i = [w_1 g_i; w_2 g'_i]^T [a_i; a'_i]``, whose ghost
norm ``<A A^T, G G^T>`` holds the cross term ``2 w_1 w_2 <a_i a'_i^T, g_i g'_i^T>`` (for one
token, ``2 w_1 w_2 (a_i . a'_i)(g_i . g'_i)``); convolutions concatenate their patches along
the spatial axis the same way; the clipped sum is one re-weighted weight gradient per call.
``state`` is what a rule reads from the layer's weights at the call's point (the weight
standardisation), recorded in the forward.

Per user (``privacy.unit=user``, user-level sampling), ``user_norm_sq`` returns each user's
``||D_u||^2``, ``D_u = sum_{i in u} G_i``, from the same calls and the batch's ``UserRows``: the
user is one example whose positions are its examples' positions concatenated (``user_rows``),
or, for instantiated gradients, their per-user sums. The clipped sum needs nothing new:
``sum_u c_u D_u = sum_i c_{u(i)} G_i`` is ``clipped`` with each row's user's factor.

One module per layer type in this package registers its rule with ``@layer_rule(...)`` on
``LAYER_RULES`` (docs/engine.md, "Adding a layer").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, TypeVar

import torch
from torch import nn

from dpbench.registry import Registry
from dpbench.training.engine.user_rows import UserRows

Tensor = torch.Tensor
#: a layer's instantiated per-example gradients (B x its weights) are kept for its clipped sum
#: (sum_i f_i G_i: no second weight-gradient pass) up to this many elements
KEEP_INSTANTIATED_ELEMENTS = 1 << 22
Kept = dict  # parameter -> [B, *shape] per-example gradients a rule chose to keep
#: the trainable parameters the weight-and-bias rules compute
RULE_PARAMETERS = frozenset({"weight", "bias"})


class Call(NamedTuple):
    """One call of a layer: its input ``a``, the gradient ``g`` at its output, ``state``, and
    the version of ``a`` when it was recorded (an in-place change after it shows)."""

    a: Tensor
    g: Tensor
    state: Any = None
    version: int = -1


Calls = list[Call]


class LayerRule:
    """How book-keeping handles one layer type: per-example squared norms and clipped sums.

    A subclass implements ``norm_sq`` and ``clipped`` (citing its equations) and may set the
    class attributes and override ``check``, ``state`` and ``entry`` below.
    """

    #: whether several calls in one forward may be summed (concatenated along the tokens)
    concat_calls: ClassVar[bool] = False
    #: the module's own trainable parameters the rule computes; any other one is refused
    parameters: ClassVar[frozenset[str]] = RULE_PARAMETERS
    #: module -> what the rule reads from its weights at the call's point (recorded in the
    #: forward, so a shifted evaluation point gets its own); None: nothing
    state: Callable[[nn.Module], Any] | None = None
    #: module -> the submodule whose *input* carries the parameters (the rule's g is the
    #: gradient there), for parameters that enter outside any layer; None: the module itself
    entry: Callable[[nn.Module], nn.Module] | None = None

    def norm_sq(self, m: nn.Module, calls: Calls, keep: Kept | None = None) -> Tensor:
        """Return per-example ||grad||^2 [B]; may store instantiated grads in ``keep``."""
        raise NotImplementedError

    def clipped(self, m: nn.Module, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
        """Return sum_i f_i grad_i for the module's trainable parameters the rule covers."""
        raise NotImplementedError

    #: whether ``user_norm_sq`` is implemented (a rule without it is refused per user)
    per_user: ClassVar[bool] = False

    def user_norm_sq(self, m: nn.Module, calls: Calls, rows: UserRows) -> Tensor:
        """Return per-user ||D_u||^2 [U], ``D_u = sum_{i in u} grad_i`` (``rows`` groups the
        calls' rows by user)."""
        raise NotImplementedError

    def check(self, m: nn.Module, cls: type) -> str | None:
        """Return why ``m`` (matched on its class ``cls``) is not what the rule's equations
        describe, or None. Called after the generic checks (own forward, extra parameters,
        computed weights, pre-hooks)."""
        return None


#: the rule of each layer class, by "module.qualname" (matched on a module's MRO, so the
#: classes of optional libraries are named without importing them)
LAYER_RULES: Registry[LayerRule] = Registry("book-keeping layer rule",
                                            builtin_package="dpbench.training.engine.rules")
R = TypeVar("R", bound=type[LayerRule])


def qualified(cls: type) -> str:
    """Return ``cls``'s registry name, "module.qualname"."""
    return f"{cls.__module__}.{cls.__qualname__}"


def layer_rule(*classes: type | str) -> Callable[[R], R]:
    """Class decorator: register one instance of the rule for each of ``classes`` (a class,
    or the "module.qualname" of a class of an optional library); duplicates are refused."""
    def register(rule_cls: R) -> R:
        rule = rule_cls()
        for c in classes:
            LAYER_RULES.register(c if isinstance(c, str) else qualified(c))(rule)
        return rule_cls
    return register


# ---- tensor helpers shared by the rules -----------------------------------------------------
def sq(x: Tensor) -> Tensor:
    """Return the per-example sum of squares of ``x`` [B, ...] -> [B] (one reduction kernel,
    no squared copy: about twice as fast as pow + sum on CPU)."""
    return torch.linalg.vector_norm(x.reshape(x.shape[0], -1), dim=1).square()


def weighted(g: Tensor, f: Tensor) -> Tensor:
    """Return g with example i scaled by f_i."""
    return g * f.view(-1, *([1] * (g.dim() - 1)))


def gram_norm_sq(a: Tensor, g: Tensor) -> Tensor:
    """Return ||sum_t g_t a_t^T||_F^2 per example via the ghost norm <a a^T, g g^T> [B]."""
    return (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))


def zeros(calls: Calls) -> Tensor:
    """Return per-example zeros [B] in the calls' dtype and device."""
    g = calls[0].g
    return torch.zeros(g.shape[0], dtype=g.dtype, device=g.device)


def sum_sq(grads: dict[nn.Parameter, Tensor], calls: Calls) -> Tensor:
    """Return sum over parameters of the per-example squared norms of ``grads``."""
    return sum((sq(v) for v in grads.values()), zeros(calls))


def user_sum_sq(grads: dict[nn.Parameter, Tensor], rows: UserRows, calls: Calls) -> Tensor:
    """Return per-user ||D_u||^2 [U] from per-example ``grads`` [B, ...] (summed per user)."""
    g = calls[0].g
    out = torch.zeros(rows.count, dtype=g.dtype, device=g.device)
    return sum((sq(rows.sums(v)) for v in grads.values()), out)


def clipped_from(grads: dict[nn.Parameter, Tensor], f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grads_i per parameter."""
    return {p: torch.einsum("b,b...->...", f.to(v.dtype), v) for p, v in grads.items()}


def added(parts: list[Tensor]) -> Tensor:
    """Return the sum of ``parts`` (the first one itself when there is one)."""
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def accumulate(out: dict[nn.Parameter, Tensor], terms: dict[nn.Parameter, Tensor]) -> None:
    """Add ``terms`` into ``out`` per parameter (a parameter new to ``out`` is set)."""
    for p, v in terms.items():
        out[p] = v if p not in out else out[p] + v


class InstantiatedRule(LayerRule):
    """A rule that forms each example's gradients ``grads(m, calls)`` [B, *shape] (small
    parameters: norms and affine maps, tokens): squared norms and clipped sums from them."""

    def grads(self, m: nn.Module, calls: Calls) -> dict[nn.Parameter, Tensor]:
        raise NotImplementedError

    def norm_sq(self, m: nn.Module, calls: Calls, keep: Kept | None = None) -> Tensor:
        return sum_sq(self.grads(m, calls), calls)

    def clipped(self, m: nn.Module, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
        return clipped_from(self.grads(m, calls), f)

    per_user = True

    def user_norm_sq(self, m: nn.Module, calls: Calls, rows: UserRows) -> Tensor:
        """Return ||D_u||^2: the instantiated per-example gradients summed per user."""
        return user_sum_sq(self.grads(m, calls), rows, calls)
