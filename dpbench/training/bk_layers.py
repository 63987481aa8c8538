"""Per-layer rules of book-keeping clipping: per-example squared norms and clipped sums.

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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.grad import conv2d_weight
from torch.nn.utils import parametrize

Tensor = torch.Tensor
#: per-example multiply-adds of a conv weight gradient above which one torch weight-gradient
#: call per example beats the batched im2col matmul (measured on CPU, ResNet-18 vs cnn2)
PER_EXAMPLE_CALL_MACS = 4_000_000
#: a layer's instantiated per-example gradients (B x its weights) are kept for its clipped sum
#: (sum_i f_i G_i: no second weight-gradient pass) up to this many elements
KEEP_INSTANTIATED_ELEMENTS = 1 << 22
Kept = dict  # parameter -> [B, *shape] per-example gradients a rule chose to keep


def _sq(x: Tensor) -> Tensor:
    """Return the per-example sum of squares of ``x`` [B, ...] -> [B] (one reduction kernel,
    no squared copy: about twice as fast as pow + sum on CPU)."""
    return torch.linalg.vector_norm(x.reshape(x.shape[0], -1), dim=1).square()


def _weighted(g: Tensor, f: Tensor) -> Tensor:
    """Return g with example i scaled by f_i."""
    return g * f.view(-1, *([1] * (g.dim() - 1)))


def _gram_norm_sq(a: Tensor, g: Tensor) -> Tensor:
    """Return ||sum_t g_t a_t^T||_F^2 per example via the ghost norm <a a^T, g g^T> [B]."""
    return (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))


# ---- Linear --------------------------------------------------------------------------------
def linear_norm_sq(m: nn.Linear, a: Tensor, g: Tensor, keep: Kept | None = None) -> Tensor:
    """Return per-example ||grad W||^2 + ||grad b||^2 of a linear layer (trainable ones)."""
    has_bias = m.bias is not None and m.bias.requires_grad
    if a.dim() == 2:  # T = 1: ||g a^T||^2 + ||g||^2 = ||g||^2 (||a||^2 + 1), few ops (MLPs)
        g_sq = _sq(g)
        if not m.weight.requires_grad:
            return g_sq
        a_sq = _sq(a)
        return g_sq * (a_sq + 1.0) if has_bias else g_sq * a_sq
    b = a.shape[0]
    out = torch.zeros(b, dtype=g.dtype, device=g.device)
    a3, g3 = a.reshape(b, -1, a.shape[-1]), g.reshape(b, -1, g.shape[-1])
    t, d_in, d_out = a3.shape[1], a3.shape[2], g3.shape[2]
    if m.weight.requires_grad:
        if t * (d_in + d_out) <= d_in * d_out:  # ghost: T^2 (d_in + d_out) <= T d_in d_out
            out = out + _gram_norm_sq(a3, g3)
        else:
            out = out + _sq(torch.bmm(g3.transpose(1, 2), a3))
    if has_bias:
        out = out + g3.sum(1).pow(2).sum(1)
    return out


def linear_clipped(m: nn.Linear, a: Tensor, g: Tensor, f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i for the layer's trainable parameters (one matmul each)."""
    out = {}
    if a.dim() == 2:  # W: (g^T diag f) a; b: g^T f
        gt = g.t()
        if m.weight.requires_grad:
            out[m.weight] = torch.mm(gt * f, a)
        if m.bias is not None and m.bias.requires_grad:
            out[m.bias] = torch.mv(gt, f)
        return out
    gw = _weighted(g, f).reshape(-1, g.shape[-1])
    if m.weight.requires_grad:
        out[m.weight] = gw.t() @ a.reshape(-1, a.shape[-1])
    if m.bias is not None and m.bias.requires_grad:
        out[m.bias] = gw.sum(0)
    return out


# ---- Conv2d --------------------------------------------------------------------------------
def _conv_input(m: nn.Conv2d, a: Tensor) -> tuple[Tensor, tuple[int, int]]:
    """Return (input padded as the layer pads it, remaining zero padding for conv2d_weight)."""
    if m.padding_mode != "zeros":
        return F.pad(a, m._reversed_padding_repeated_twice, mode=m.padding_mode), (0, 0)
    if isinstance(m.padding, str):  # "valid" or "same" (stride 1): torch's own amounts
        return F.pad(a, m._reversed_padding_repeated_twice), (0, 0)
    return a, tuple(m.padding)


def _patches(m: nn.Conv2d, a: Tensor, out_hw: tuple[int, int]) -> Tensor:
    """Return a strided view [B, G, C/G, kh, kw, H', W'] of the padded input (no im2col loop)."""
    x, (ph, pw) = _conv_input(m, a)
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    x = x.contiguous()
    b, c = x.shape[:2]
    kh, kw = m.kernel_size
    sh, sw = m.stride
    dh, dw = m.dilation
    s = x.stride()
    view = x.as_strided((b, c, kh, kw, *out_hw),
                        (s[0], s[1], dh * s[2], dw * s[3], sh * s[2], sw * s[3]))
    return view.unflatten(1, (m.groups, c // m.groups))


def conv2d_norm_sq(m: nn.Conv2d, a: Tensor, g: Tensor, keep: Kept | None = None) -> Tensor:
    """Return per-example ||grad W||^2 + ||grad b||^2 of a 2-d convolution.

    The patches [B, C k^2, L] are one copy of a strided view of the padded input (not
    unfold's per-example loop); instantiation is ``G_i = g_i P_i^T`` (one bmm), the ghost norm
    ``<P_i^T P_i, g_i^T g_i>``, whichever costs fewer multiply-adds. Large layers (ResNet
    stages) instantiate with torch's weight gradient, one call per example. Instantiated
    gradients small enough are stored in ``keep`` for the clipped sum.
    """
    b, o = g.shape[:2]
    out = torch.zeros(b, dtype=g.dtype, device=g.device)
    if m.weight.requires_grad:
        grp = m.groups
        c_k = m.weight.shape[1] * m.weight.shape[2] * m.weight.shape[3]
        length = g.shape[2] * g.shape[3]
        if keep is not None and b * o * c_k <= KEEP_INSTANTIATED_ELEMENTS:
            # kept G_i make the clipped sum free, which the ghost norm would still pay for
            # (a weight-gradient pass, L O C k^2): ghost only if L^2 (C k^2 + O) < O C k^2
            ghost = length * length * (c_k + o // grp) < c_k * (o // grp)
        else:
            ghost = length * (c_k + o // grp) <= c_k * (o // grp)
        if not ghost and o * c_k * length >= PER_EXAMPLE_CALL_MACS:
            # large layer: torch's own weight gradient per example costs about what the
            # whole-batch one does (no im2col copy), and B calls are cheap next to it
            x, padding = _conv_input(m, a)
            per_example = torch.stack([
                conv2d_weight(x[i:i + 1], m.weight.shape, g[i:i + 1], m.stride, padding,
                              m.dilation, m.groups) for i in range(b)])
            _keep(keep, m, per_example, g)
            return _sq(per_example) + _conv_bias_sq(m, g)
        # one strided copy in the view's own order [B*G, C/G*kh*kw, L] (a permuting copy,
        # as einsum makes, is several times slower on CPU)
        p = _patches(m, a, tuple(g.shape[2:])).reshape(b * grp, -1, g.shape[2] * g.shape[3])
        gg = g.reshape(b * grp, o // grp, -1)  # [B*G, O/G, L]
        if ghost:  # ghost norm is cheaper
            per = _gram_norm_sq(p.transpose(1, 2), gg.transpose(1, 2))
        else:  # instantiate G_i = g_i P_i^T [O/G, C/G k^2]
            per_example = torch.bmm(gg, p.transpose(1, 2))
            _keep(keep, m, per_example.view(b, *m.weight.shape), g)
            per = _sq(per_example)
        out = out + per.view(b, grp).sum(1)
    return out + _conv_bias_sq(m, g)


def _keep(keep: Kept | None, m: nn.Conv2d, weight_grads: Tensor, g: Tensor) -> None:
    """Store the per-example weight (and bias) gradients in ``keep`` if they are small."""
    if keep is None or weight_grads.numel() > KEEP_INSTANTIATED_ELEMENTS:
        return
    keep[m.weight] = weight_grads
    if m.bias is not None and m.bias.requires_grad:
        keep[m.bias] = g.sum((2, 3))


def _conv_bias_sq(m: nn.Conv2d, g: Tensor) -> Tensor | float:
    if m.bias is not None and m.bias.requires_grad:
        return g.sum((2, 3)).pow(2).sum(1)
    return 0.0


def conv2d_clipped(m: nn.Conv2d, a: Tensor, g: Tensor, f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i: torch's weight gradient with re-weighted output gradients."""
    gw = _weighted(g, f)
    out = {}
    if m.weight.requires_grad:
        x, padding = _conv_input(m, a)
        out[m.weight] = conv2d_weight(x, m.weight.shape, gw, m.stride, padding, m.dilation,
                                      m.groups)
    if m.bias is not None and m.bias.requires_grad:
        out[m.bias] = gw.sum((0, 2, 3))
    return out


# ---- Embedding -----------------------------------------------------------------------------
def _embedding_grad_out(m: nn.Embedding, idx: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Return (indices [B, T], output grads [B, T, d]), the padding row's grads zeroed."""
    b = idx.shape[0]
    idx, g = idx.reshape(b, -1), g.reshape(b, -1, g.shape[-1])
    if m.padding_idx is not None:
        g = g * (idx != m.padding_idx).unsqueeze(-1).to(g.dtype)
    return idx, g


def embedding_norm_sq(m: nn.Embedding, a: Tensor, g: Tensor, keep: Kept | None = None) -> Tensor:
    """Return ||grad E||^2 per example: sum_{t,s} [x_t = x_s] g_t . g_s (ghost; V d is large)."""
    idx, g = _embedding_grad_out(m, a, g)
    same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g.dtype)
    return (same * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))


def embedding_clipped(m: nn.Embedding, a: Tensor, g: Tensor,
                      f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i: re-weighted output grads added into their rows."""
    idx, g = _embedding_grad_out(m, a, g)
    gw = _weighted(g, f)
    out = torch.zeros_like(m.weight).index_add_(0, idx.reshape(-1), gw.reshape(-1, g.shape[-1]))
    return {m.weight: out}


# ---- LayerNorm / GroupNorm -----------------------------------------------------------------
def _norm_affine_grads(m: nn.Module, a: Tensor, g: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return per-example grads [B, *param.shape] of a norm layer's affine parameters."""
    if isinstance(m, nn.GroupNorm):
        x_hat = F.group_norm(a, m.num_groups, eps=m.eps)
        dims = tuple(range(2, a.dim()))
    else:
        x_hat = F.layer_norm(a, m.normalized_shape, eps=m.eps)
        dims = tuple(range(1, a.dim() - len(m.normalized_shape)))
    out = {}
    if m.weight is not None and m.weight.requires_grad:
        out[m.weight] = (x_hat * g).sum(dims) if dims else x_hat * g
    if m.bias is not None and m.bias.requires_grad:
        out[m.bias] = g.sum(dims) if dims else g
    return out


def norm_layer_norm_sq(m: nn.Module, a: Tensor, g: Tensor, keep: Kept | None = None) -> Tensor:
    """Return per-example squared norms of a LayerNorm/GroupNorm's affine gradients."""
    grads = _norm_affine_grads(m, a, g)
    return sum((_sq(v) for v in grads.values()),
               torch.zeros(a.shape[0], dtype=g.dtype, device=g.device))


def norm_layer_clipped(m: nn.Module, a: Tensor, g: Tensor,
                       f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i of a LayerNorm/GroupNorm's affine parameters."""
    return {p: torch.einsum("b,b...->...", f.to(v.dtype), v)
            for p, v in _norm_affine_grads(m, a, g).items()}


@dataclass(frozen=True)
class LayerRule:
    """How book-keeping handles one layer type (per-example norms^2, clipped sums)."""

    #: (module, a, g, keep) -> per-example ||grad||^2; may store instantiated grads in keep
    norm_sq: Callable[..., Tensor]
    clipped: Callable[[nn.Module, Tensor, Tensor, Tensor], dict[nn.Parameter, Tensor]]
    #: whether several calls in one forward may be concatenated along the token axis
    concat_calls: bool = False


RULES: dict[type, LayerRule] = {
    nn.Linear: LayerRule(linear_norm_sq, linear_clipped, concat_calls=True),
    nn.Conv2d: LayerRule(conv2d_norm_sq, conv2d_clipped),
    nn.Embedding: LayerRule(embedding_norm_sq, embedding_clipped),
    nn.LayerNorm: LayerRule(norm_layer_norm_sq, norm_layer_clipped),
    nn.GroupNorm: LayerRule(norm_layer_norm_sq, norm_layer_clipped),
}


#: the trainable parameters a rule computes; a layer owning any other one is not covered
RULE_PARAMETERS = frozenset({"weight", "bias"})


def _rule_class(module: nn.Module) -> type | None:
    """Return the class in ``RULES`` that ``module`` is (or derives from), None if none."""
    for cls in type(module).__mro__:
        if cls in RULES:
            return cls
    return None


def rule_for(module: nn.Module) -> LayerRule | None:
    """Return the rule for ``module``, None if no rule computes its gradients exactly.

    A subclass of a rule's class gets the rule only if it keeps that class's ``forward`` and
    owns no trainable parameter besides ``weight`` and ``bias`` (what the rule's equations
    cover: eq. 2 of Bu et al. for the layer's own computation, nothing else). A LoRA
    ``Linear`` with its own ``forward``, a weight-standardised ``Conv2d`` or a ``LayerNorm``
    over another axis computes something else from the same recorded input and output
    gradient.
    """
    cls = _rule_class(module)
    if cls is None or type(module).forward is not cls.forward:
        return None
    return RULES[cls]


def unsupported_reason(module: nn.Module) -> str | None:
    """Return why book-keeping cannot handle ``module`` exactly, or None if it can."""
    cls = _rule_class(module)
    name = type(module).__name__
    if cls is None:
        return f"no book-keeping rule for {name}"
    if type(module).forward is not cls.forward:
        return f"{name} subclasses {cls.__name__} with its own forward"
    extra = sorted(n for n, p in module.named_parameters(recurse=False)
                   if p.requires_grad and n not in RULE_PARAMETERS)
    if extra:
        return f"{name} has trainable parameters {', '.join(extra)} no rule covers"
    if parametrize.is_parametrized(module):
        return f"{name} computes its weight (a parametrization)"
    for n in RULE_PARAMETERS:
        value = getattr(module, n, None)
        if value is not None and not isinstance(value, nn.Parameter):
            return f"{name}.{n} is computed, not a parameter (e.g. old-style weight_norm)"
    if module._forward_pre_hooks:  # weight_norm, spectral_norm, pruning compute weights so
        return f"{name} has forward pre-hooks, which may compute its weight"
    if isinstance(module, nn.Embedding) and (module.scale_grad_by_freq or module.sparse):
        return "Embedding with scale_grad_by_freq or sparse gradients"
    if isinstance(module, nn.Conv2d) and module.padding_mode not in (
            "zeros", "reflect", "replicate", "circular"):
        return f"Conv2d padding_mode {module.padding_mode!r}"
    return None
