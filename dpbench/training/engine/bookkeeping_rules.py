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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

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


class Call(NamedTuple):
    """One call of a layer: its input ``a``, the gradient ``g`` at its output, ``state``, and
    the version of ``a`` when it was recorded (an in-place change after it shows)."""

    a: Tensor
    g: Tensor
    state: Any = None
    version: int = -1


Calls = list[Call]


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


def _zeros(calls: Calls) -> Tensor:
    g = calls[0].g
    return torch.zeros(g.shape[0], dtype=g.dtype, device=g.device)


def _sum_sq(grads: dict[nn.Parameter, Tensor], calls: Calls) -> Tensor:
    """Return sum over parameters of the per-example squared norms of ``grads``."""
    return sum((_sq(v) for v in grads.values()), _zeros(calls))


def _clipped_from(grads: dict[nn.Parameter, Tensor], f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grads_i per parameter."""
    return {p: torch.einsum("b,b...->...", f.to(v.dtype), v) for p, v in grads.items()}


def _token_merged(calls: Calls) -> tuple[Tensor, Tensor]:
    """Return (a, g) of the calls concatenated along the token axis (exact for a layer whose
    per-example gradient is a sum over tokens, eq. 2); one call is returned as it is."""
    if len(calls) == 1:
        return calls[0].a, calls[0].g
    b = calls[0].a.shape[0]
    a = torch.cat([c.a.reshape(b, -1, c.a.shape[-1]) for c in calls], dim=1)
    g = torch.cat([c.g.reshape(b, -1, c.g.shape[-1]) for c in calls], dim=1)
    return a, g


def _added(parts: list[Tensor]) -> Tensor:
    """Return the sum of ``parts`` (the first one itself when there is one)."""
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


# ---- Linear --------------------------------------------------------------------------------
def linear_norm_sq(m: nn.Linear, calls: Calls, keep: Kept | None = None) -> Tensor:
    """Return per-example ||grad W||^2 + ||grad b||^2 of a linear layer (trainable ones)."""
    a, g = _token_merged(calls)
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


def linear_clipped(m: nn.Linear, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i for the layer's trainable parameters (one matmul each)."""
    a, g = _token_merged(calls)
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


# ---- Conv2d (and Conv1d as a Conv2d of height 1) -------------------------------------------
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


def _cat_spatial(parts: list[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def _conv_per_example_loop(m: nn.Conv2d, calls: Calls, shape: torch.Size) -> Tensor:
    """Return [B, *shape] per-example weight gradients, one torch weight-gradient call each."""
    b = calls[0].g.shape[0]
    out = None
    for c in calls:
        x, padding = _conv_input(m, c.a)
        per = torch.stack([conv2d_weight(x[i:i + 1], shape, c.g[i:i + 1], m.stride, padding,
                                         m.dilation, m.groups) for i in range(b)])
        out = per if out is None else out + per
    return out


def _conv_patch_operands(m: nn.Conv2d, calls: Calls) -> list[tuple[Tensor, Tensor]]:
    """Return per call (patches [B*G, C/G k^2, L], output grads [B*G, O/G, L])."""
    b, o = calls[0].g.shape[:2]
    grp = m.groups
    # one strided copy in the view's own order (a permuting copy, as einsum makes, is several
    # times slower on CPU)
    return [(_patches(m, c.a, tuple(c.g.shape[2:])).reshape(
        b * grp, -1, c.g.shape[2] * c.g.shape[3]), c.g.reshape(b * grp, o // grp, -1))
        for c in calls]


def _instantiated(operands: list[tuple[Tensor, Tensor]]) -> Tensor:
    """Return G_i = sum_c g_c P_c^T [B*G, O/G, C/G k^2] (one bmm per call, no concatenation)."""
    return _added([torch.bmm(gg, p.transpose(1, 2)) for p, gg in operands])


def conv_weight_per_example(m: nn.Conv2d, calls: Calls, shape: torch.Size) -> Tensor:
    """Return [B, *shape] per-example gradients of a conv's (effective) weight, instantiated."""
    b, o = calls[0].g.shape[:2]
    c_k = shape[1] * shape[2] * shape[3]
    length = sum(c.g.shape[2] * c.g.shape[3] for c in calls)
    if o * c_k * length >= PER_EXAMPLE_CALL_MACS:
        return _conv_per_example_loop(m, calls, shape)
    return _instantiated(_conv_patch_operands(m, calls)).view(b, *shape)


def conv2d_norm_sq(m: nn.Conv2d, calls: Calls, keep: Kept | None = None) -> Tensor:
    """Return per-example ||grad W||^2 + ||grad b||^2 of a 2-d convolution.

    The patches [B, C k^2, L] are one copy of a strided view of the padded input (not
    unfold's per-example loop); instantiation is ``G_i = g_i P_i^T`` (one bmm), the ghost norm
    ``<P_i^T P_i, g_i^T g_i>``, whichever costs fewer multiply-adds (Bu et al. eq. 2 and 4 with
    the L output positions as tokens; several calls are concatenated along L). Large layers
    (ResNet stages) instantiate with torch's weight gradient, one call per example.
    Instantiated gradients small enough are stored in ``keep`` for the clipped sum.
    """
    b, o = calls[0].g.shape[:2]
    out = torch.zeros(b, dtype=calls[0].g.dtype, device=calls[0].g.device)
    if m.weight.requires_grad:
        grp = m.groups
        c_k = m.weight.shape[1] * m.weight.shape[2] * m.weight.shape[3]
        length = sum(c.g.shape[2] * c.g.shape[3] for c in calls)
        if keep is not None and b * o * c_k <= KEEP_INSTANTIATED_ELEMENTS:
            # kept G_i make the clipped sum free, which the ghost norm would still pay for
            # (a weight-gradient pass, L O C k^2): ghost only if L^2 (C k^2 + O) < O C k^2
            ghost = length * length * (c_k + o // grp) < c_k * (o // grp)
        else:
            ghost = length * (c_k + o // grp) <= c_k * (o // grp)
        if not ghost and o * c_k * length >= PER_EXAMPLE_CALL_MACS:
            # large layer: torch's own weight gradient per example costs about what the
            # whole-batch one does (no im2col copy), and B calls are cheap next to it
            per_example = _conv_per_example_loop(m, calls, m.weight.shape)
            _keep(keep, m, per_example, calls)
            return _sq(per_example) + _conv_bias_sq(m, calls)
        operands = _conv_patch_operands(m, calls)
        if ghost:  # ghost norm is cheaper: the calls' positions concatenated along L
            p = _cat_spatial([op[0] for op in operands])
            gg = _cat_spatial([op[1] for op in operands])
            per = _gram_norm_sq(p.transpose(1, 2), gg.transpose(1, 2))
        else:  # instantiate G_i = sum_c g_c P_c^T [O/G, C/G k^2]
            per_example = _instantiated(operands)
            _keep(keep, m, per_example.view(b, *m.weight.shape), calls)
            per = _sq(per_example)
        out = out + per.view(b, grp).sum(1)
    return out + _conv_bias_sq(m, calls)


def _conv_bias_grads(calls: Calls) -> Tensor:
    """Return [B, O] per-example bias gradients sum_c sum_l g_c."""
    dims = tuple(range(2, calls[0].g.dim()))
    out = calls[0].g.sum(dims)
    for c in calls[1:]:
        out = out + c.g.sum(dims)
    return out


def _keep(keep: Kept | None, m: nn.Conv2d, weight_grads: Tensor, calls: Calls) -> None:
    """Store the per-example weight (and bias) gradients in ``keep`` if they are small."""
    if keep is None or weight_grads.numel() > KEEP_INSTANTIATED_ELEMENTS:
        return
    keep[m.weight] = weight_grads
    if m.bias is not None and m.bias.requires_grad:
        keep[m.bias] = _conv_bias_grads(calls)


def _conv_bias_sq(m: nn.Conv2d, calls: Calls) -> Tensor | float:
    if m.bias is not None and m.bias.requires_grad:
        return _conv_bias_grads(calls).pow(2).sum(1)
    return 0.0


def _conv_weight_sum(m: nn.Conv2d, c: Call, f: Tensor, shape: torch.Size) -> Tensor:
    """Return sum_i f_i G_i of one call: torch's weight gradient with re-weighted g (eq. 5)."""
    x, padding = _conv_input(m, c.a)
    return conv2d_weight(x, shape, _weighted(c.g, f), m.stride, padding, m.dilation, m.groups)


def conv2d_clipped(m: nn.Conv2d, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i: torch's weight gradient with re-weighted output gradients."""
    out = {}
    if m.weight.requires_grad:
        out[m.weight] = _added([_conv_weight_sum(m, c, f, m.weight.shape) for c in calls])
    if m.bias is not None and m.bias.requires_grad:
        out[m.bias] = torch.mv(_conv_bias_grads(calls).t(), f.to(calls[0].g.dtype))
    return out


class _Conv1dAs2d:
    """A ``Conv1d`` seen as a ``Conv2d`` of height 1 (kernel 1 x k): what the 2-d rules read.

    ``weight`` is a [O, C/G, 1, k] view of the layer's weight, so its gradients are the
    Conv1d's, reshaped (the 1-d convolution is the 2-d one on a height-1 input).
    """

    def __init__(self, m: nn.Conv1d) -> None:
        self.source = m
        self.weight = m.weight.unsqueeze(2)
        self.bias = m.bias
        self.groups = m.groups
        self.kernel_size = (1, m.kernel_size[0])
        self.stride = (1, m.stride[0])
        self.dilation = (1, m.dilation[0])
        self.padding = m.padding if isinstance(m.padding, str) else (0, m.padding[0])
        self.padding_mode = m.padding_mode
        self._reversed_padding_repeated_twice = [*m._reversed_padding_repeated_twice, 0, 0]

    def back(self, grads: dict) -> dict[nn.Parameter, Tensor]:
        """Return ``grads`` keyed by the Conv1d's own parameters, in their shapes."""
        out = {}
        for p, v in grads.items():
            if p is self.weight:
                lead = v.shape[:v.dim() - self.weight.dim()]
                out[self.source.weight] = v.reshape(*lead, *self.source.weight.shape)
            else:
                out[p] = v
        return out


def _as_2d_calls(calls: Calls) -> Calls:
    return [Call(c.a.unsqueeze(2), c.g.unsqueeze(2), c.state) for c in calls]


def conv1d_norm_sq(m: nn.Conv1d, calls: Calls, keep: Kept | None = None) -> Tensor:
    """Return per-example squared gradient norms of a Conv1d (the Conv2d rule, height 1)."""
    view, kept = _Conv1dAs2d(m), {} if keep is not None else None
    out = conv2d_norm_sq(view, _as_2d_calls(calls), kept)
    if kept:
        keep.update(view.back(kept))
    return out


def conv1d_clipped(m: nn.Conv1d, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i of a Conv1d (the Conv2d rule, height 1)."""
    view = _Conv1dAs2d(m)
    return view.back(conv2d_clipped(view, _as_2d_calls(calls), f))


# ---- weight-standardised convolutions (timm StdConv2d, ScaledStdConv2d) --------------------
@dataclass(frozen=True)
class Standardisation:
    """The weight standardisation of one output channel per row, at one point.

    ``W_eff[o] = gain_o * scale * (W[o] - mean W[o]) / s_o``, ``s_o = sqrt(var W[o] + eps)``
    (biased variance over the C/G k^2 entries of row o): the weight standardisation of Qiao et
    al. 2019, "Micro-batch training with batch-channel normalization and weight
    standardization", as timm computes it (``F.batch_norm`` over the rows), with the gain and
    the fan-in scale of Brock et al. 2021, "Characterizing signal propagation to close the
    performance gap in unnormalized ResNets". ``gain_scale`` is None for ``StdConv2d``. The
    per-example gradient of W is the chain rule through this map (Bu et al. eq. 2 gives the
    gradient of W_eff).
    """

    w_hat: Tensor  # [O, n] the standardised rows
    inv_s: Tensor  # [O, 1] 1 / s_o
    gain_scale: Tensor | None  # [O, 1] gain_o * scale
    scale: float


def std_conv_state(m: nn.Conv2d) -> Standardisation:
    """Return the layer's standardisation at its current weights (recorded in the forward)."""
    with torch.no_grad():
        w = m.weight.detach().reshape(m.weight.shape[0], -1)
        var, mean = torch.var_mean(w, dim=1, correction=0, keepdim=True)
        inv_s = torch.rsqrt(var + m.eps)
        gain = getattr(m, "gain", None)
        gain_scale = None if gain is None else gain.detach().reshape(-1, 1) * m.scale
        return Standardisation((w - mean) * inv_s, inv_s, gain_scale, float(getattr(m, "scale",
                                                                                    1.0)))


def _std_weight_grads(m: nn.Conv2d, state: Standardisation,
                      g_eff: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return the gradients of W (and gain) from ``g_eff`` [..., O, C/G, kh, kw], the gradient
    with respect to the effective (standardised) weight, through the standardisation's Jacobian.

    Row by row, with ``H = dL/dW_hat`` (``gain scale g_eff`` for ScaledStdConv2d):
    ``dL/dW = (H - mean(H) - W_hat mean(H * W_hat)) / s`` (the normalisation's backward, as for
    LayerNorm: Ba et al. 2016) and ``dL/dgain = scale <W_hat, g_eff>``.
    """
    lead = g_eff.shape[:g_eff.dim() - 4]
    rows = g_eff.reshape(*lead, m.weight.shape[0], -1)
    out = {}
    h = rows if state.gain_scale is None else rows * state.gain_scale
    if m.weight.requires_grad:
        dw = (h - h.mean(-1, keepdim=True)
              - state.w_hat * (h * state.w_hat).mean(-1, keepdim=True)) * state.inv_s
        out[m.weight] = dw.reshape(*lead, *m.weight.shape)
    gain = getattr(m, "gain", None)
    if gain is not None and gain.requires_grad:
        out[gain] = (state.scale * (rows * state.w_hat).sum(-1)).reshape(*lead, *gain.shape)
    return out


def _std_per_example(m: nn.Conv2d, calls: Calls) -> dict[nn.Parameter, Tensor]:
    out: dict[nn.Parameter, Tensor] = {}
    for c in calls:
        for p, v in _std_weight_grads(m, c.state,
                                      conv_weight_per_example(m, [c], m.weight.shape)).items():
            out[p] = v if p not in out else out[p] + v
    if m.bias is not None and m.bias.requires_grad:
        out[m.bias] = _conv_bias_grads(calls)
    return out


def std_conv_norm_sq(m: nn.Conv2d, calls: Calls, keep: Kept | None = None) -> Tensor:
    """Return per-example squared norms of a weight-standardised conv's gradients.

    Instantiated: each call's per-example gradient with respect to the standardised weight
    (the Conv2d rule's ``g_i P_i^T``) pushed through the Jacobian of its point's
    standardisation (``_std_weight_grads``), summed over the calls.
    """
    grads = _std_per_example(m, calls)
    if keep is not None and sum(v.numel() for v in grads.values()) <= KEEP_INSTANTIATED_ELEMENTS:
        keep.update(grads)
    return _sum_sq(grads, calls)


def std_conv_clipped(m: nn.Conv2d, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i: the Jacobian is the same for every example, so it is applied
    once per call to the re-weighted weight gradient sum_i f_i G_i (linearity)."""
    out: dict[nn.Parameter, Tensor] = {}
    for c in calls:
        for p, v in _std_weight_grads(m, c.state,
                                      _conv_weight_sum(m, c, f, m.weight.shape)).items():
            out[p] = v if p not in out else out[p] + v
    if m.bias is not None and m.bias.requires_grad:
        out[m.bias] = torch.mv(_conv_bias_grads(calls).t(), f.to(calls[0].g.dtype))
    return out


# ---- Embedding -----------------------------------------------------------------------------
def _embedding_grad_out(m: nn.Embedding, calls: Calls) -> tuple[Tensor, Tensor]:
    """Return (indices [B, T], output grads [B, T, d]) of the calls concatenated along T, the
    padding row's grads zeroed."""
    b = calls[0].a.shape[0]
    idx = torch.cat([c.a.reshape(b, -1) for c in calls], dim=1) if len(calls) > 1 else \
        calls[0].a.reshape(b, -1)
    g = torch.cat([c.g.reshape(b, -1, c.g.shape[-1]) for c in calls], dim=1) \
        if len(calls) > 1 else calls[0].g.reshape(b, -1, calls[0].g.shape[-1])
    if m.padding_idx is not None:
        g = g * (idx != m.padding_idx).unsqueeze(-1).to(g.dtype)
    return idx, g


def embedding_norm_sq(m: nn.Embedding, calls: Calls, keep: Kept | None = None) -> Tensor:
    """Return ||grad E||^2 per example: sum_{t,s} [x_t = x_s] g_t . g_s (ghost; V d is large)."""
    idx, g = _embedding_grad_out(m, calls)
    same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g.dtype)
    return (same * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))


def embedding_clipped(m: nn.Embedding, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i: re-weighted output grads added into their rows."""
    idx, g = _embedding_grad_out(m, calls)
    gw = _weighted(g, f)
    out = torch.zeros_like(m.weight).index_add_(0, idx.reshape(-1), gw.reshape(-1, g.shape[-1]))
    return {m.weight: out}


# ---- LayerNorm / GroupNorm / RMSNorm / timm LayerNorm2d ------------------------------------
def _normalised(m: nn.Module, a: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """Return (x_hat, the dims the affine gradients sum over besides the example's)."""
    if isinstance(m, nn.GroupNorm):
        return F.group_norm(a, m.num_groups, eps=m.eps), tuple(range(2, a.dim()))
    if isinstance(m, nn.RMSNorm):
        x_hat = F.rms_norm(a, m.normalized_shape, eps=m.eps)
        return x_hat, tuple(range(1, a.dim() - len(m.normalized_shape)))
    if channels_first(m):  # timm LayerNorm2d: over C of [B, C, H, W]
        x_hat = F.layer_norm(a.permute(0, 2, 3, 1), m.normalized_shape, eps=m.eps)
        return x_hat.permute(0, 3, 1, 2), tuple(range(2, a.dim()))
    return (F.layer_norm(a, m.normalized_shape, eps=m.eps),
            tuple(range(1, a.dim() - len(m.normalized_shape))))


def _norm_affine_grads(m: nn.Module, calls: Calls) -> dict[nn.Parameter, Tensor]:
    """Return per-example grads [B, *param.shape] of a norm layer's affine parameters.

    ``y = x_hat * weight + bias``: grad weight_i = sum x_hat_i g_i and grad bias_i = sum g_i
    over the positions the parameters are broadcast over (the affine map of layer
    normalisation, Ba et al. 2016, and of RMSNorm, Zhang and Sennrich 2019, whose x_hat is
    x / RMS(x)), summed over the calls.
    """
    out: dict[nn.Parameter, Tensor] = {}
    weight, bias = getattr(m, "weight", None), getattr(m, "bias", None)
    for c in calls:
        x_hat, dims = _normalised(m, c.a)
        g = c.g
        terms = {}
        if weight is not None and weight.requires_grad:
            terms[weight] = (x_hat * g).sum(dims) if dims else x_hat * g
        if bias is not None and bias.requires_grad:
            terms[bias] = g.sum(dims) if dims else g
        for p, v in terms.items():
            out[p] = v if p not in out else out[p] + v
    return out


def norm_layer_norm_sq(m: nn.Module, calls: Calls, keep: Kept | None = None) -> Tensor:
    """Return per-example squared norms of a norm layer's affine gradients."""
    return _sum_sq(_norm_affine_grads(m, calls), calls)


def norm_layer_clipped(m: nn.Module, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i of a norm layer's affine parameters."""
    return _clipped_from(_norm_affine_grads(m, calls), f)


# ---- timm LayerScale: y = x * gamma --------------------------------------------------------
def _layer_scale_grads(m: nn.Module, calls: Calls) -> dict[nn.Parameter, Tensor]:
    """Return per-example grads of gamma: sum over the token dims of a_i * g_i (the product
    rule for ``y = x * gamma``, gamma broadcast over the tokens: LayerScale of Touvron et al.
    2021, "Going deeper with image transformers")."""
    out = None
    for c in calls:
        term = (c.a * c.g).reshape(c.a.shape[0], -1, c.a.shape[-1]).sum(1)
        out = term if out is None else out + term
    return {m.gamma: out} if m.gamma.requires_grad else {}


def layer_scale_norm_sq(m: nn.Module, calls: Calls, keep: Kept | None = None) -> Tensor:
    """Return per-example squared norms of a LayerScale's gradient."""
    return _sum_sq(_layer_scale_grads(m, calls), calls)


def layer_scale_clipped(m: nn.Module, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i of a LayerScale's gamma."""
    return _clipped_from(_layer_scale_grads(m, calls), f)


def layer_scale_check(m: nn.Module) -> str | None:
    """Refuse the in-place LayerScale: it overwrites the input the rule reads."""
    return "LayerScale(inplace=True) overwrites its input" if m.inplace else None


# ---- a learned bias appended to the sequence: Opacus's SequenceBias ------------------------
def _sequence_bias_grads(m: nn.Module, calls: Calls) -> dict[nn.Parameter, Tensor]:
    """Return per-example grads of the bias appended as the last token: ``g_i[-1]``.

    ``y_i = [x_i; b]`` along the token axis (batch first): the concatenation's backward gives
    example i's gradient of b as its output gradient at the appended position, never a sum
    over examples.
    """
    out = _added([c.g[:, -1] for c in calls])
    return {m.bias: out} if m.bias.requires_grad else {}


def sequence_bias_norm_sq(m: nn.Module, calls: Calls, keep: Kept | None = None) -> Tensor:
    """Return per-example squared norms of a SequenceBias's gradient."""
    return _sum_sq(_sequence_bias_grads(m, calls), calls)


def sequence_bias_clipped(m: nn.Module, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i of a SequenceBias's bias."""
    return _clipped_from(_sequence_bias_grads(m, calls), f)


def sequence_bias_check(m: nn.Module) -> str | None:
    """Refuse the time-first SequenceBias: its output has the sequence, not the example, on
    dim 0."""
    return None if m.batch_first else "SequenceBias(batch_first=False) is time-first"


# ---- parameters outside layers: timm's VisionTransformer ----------------------------------
def vit_entry(m: nn.Module) -> nn.Module:
    """Return the submodule whose input is where ViT's own parameters have entered.

    ViT's input ``z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos`` (Dosovitskiy et al. 2021,
    eq. 1): in timm's ``_pos_embed`` the class (and register) tokens are concatenated before
    the patch tokens and ``pos_embed`` is added (before or after the concatenation,
    ``no_embed_class``); the sum z goes into ``pos_drop``. Without a position embedding the
    concatenation is returned as it is and goes into ``patch_drop``.
    """
    return m.pos_drop if m.pos_embed is not None else m.patch_drop


def _vit_grads(m: nn.Module, calls: Calls) -> dict[nn.Parameter, Tensor]:
    """Return per-example gradients of ``cls_token``, ``reg_token`` and ``pos_embed``.

    With ``g = dL/dz`` [B, T, D] at the entry (``vit_entry``): ``z = [cls; reg; patches] +
    pos_embed`` is an addition broadcast over the batch, so example i's gradient of
    ``pos_embed`` is ``g_i`` itself (``g_i[prefix:]`` when the position embedding skips the
    prefix tokens) and that of a prepended token is ``g_i`` at its position (the
    concatenation's backward): sums over the broadcast (batch) dim are never taken.
    """
    g = calls[0].g
    for c in calls[1:]:
        g = g + c.g
    b, prefix = g.shape[0], m.num_prefix_tokens
    out = {}
    start = 0
    if m.cls_token is not None:
        if m.cls_token.requires_grad:
            out[m.cls_token] = g[:, 0:1].reshape(b, *m.cls_token.shape)
        start = 1
    if m.reg_token is not None and m.reg_token.requires_grad:
        out[m.reg_token] = g[:, start:start + m.reg_token.shape[1]].reshape(b, *m.reg_token.shape)
    if m.pos_embed is not None and m.pos_embed.requires_grad:
        pos = g[:, prefix:] if m.no_embed_class else g
        out[m.pos_embed] = pos.reshape(b, *m.pos_embed.shape)
    return out


def vit_norm_sq(m: nn.Module, calls: Calls, keep: Kept | None = None) -> Tensor:
    """Return per-example squared norms of the ViT's own parameters' gradients."""
    return _sum_sq(_vit_grads(m, calls), calls)


def vit_clipped(m: nn.Module, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i of the ViT's own parameters."""
    return _clipped_from(_vit_grads(m, calls), f)


def vit_check(m: nn.Module) -> str | None:
    """Return why the ViT's own parameters are not where ``vit_entry`` reads them, or None."""
    cls = _rule_class(m)
    for name in ("forward_features", "_pos_embed"):
        if getattr(type(m), name) is not getattr(cls, name):
            return f"{type(m).__name__} overrides {name}"
    if m.dynamic_img_size:
        return "VisionTransformer with dynamic_img_size (pos_embed is resampled in the forward)"
    if any(True for _ in vit_entry(m).parameters()):
        return "VisionTransformer whose pos_drop / patch_drop has parameters"
    return None


# ---- the table ------------------------------------------------------------------------------
#: the trainable parameters the weight-and-bias rules compute
RULE_PARAMETERS = frozenset({"weight", "bias"})


@dataclass(frozen=True)
class LayerRule:
    """How book-keeping handles one layer type (per-example norms^2, clipped sums)."""

    #: (module, calls, keep) -> per-example ||grad||^2; may store instantiated grads in keep
    norm_sq: Callable[..., Tensor]
    clipped: Callable[[nn.Module, Calls, Tensor], dict[nn.Parameter, Tensor]]
    #: whether several calls in one forward may be summed (concatenated along the tokens)
    concat_calls: bool = False
    #: the module's own trainable parameters the rule computes; any other one is refused
    parameters: frozenset[str] = RULE_PARAMETERS
    #: module -> what the rule reads from its weights at the call's point (recorded in the
    #: forward, so a shifted evaluation point gets its own), or None
    state: Callable[[nn.Module], Any] | None = None
    #: module -> the submodule whose *input* carries the parameters (the rule's g is the
    #: gradient there), for parameters that enter outside any layer; None: the module itself
    entry: Callable[[nn.Module], nn.Module] | None = None
    #: module -> why its structure is not what the rule's equations describe, or None
    check: Callable[[nn.Module], str | None] | None = None


RULES: dict[type, LayerRule] = {
    nn.Linear: LayerRule(linear_norm_sq, linear_clipped, concat_calls=True),
    nn.Conv2d: LayerRule(conv2d_norm_sq, conv2d_clipped),
    nn.Conv1d: LayerRule(conv1d_norm_sq, conv1d_clipped),
    nn.Embedding: LayerRule(embedding_norm_sq, embedding_clipped),
    nn.LayerNorm: LayerRule(norm_layer_norm_sq, norm_layer_clipped),
    nn.GroupNorm: LayerRule(norm_layer_norm_sq, norm_layer_clipped),
    nn.RMSNorm: LayerRule(norm_layer_norm_sq, norm_layer_clipped),
}
_NORM = LayerRule(norm_layer_norm_sq, norm_layer_clipped)
#: rules for classes of optional libraries, by "module.qualname" (matched on the class's
#: MRO, so timm is never imported here): the same equations as above for timm's LayerNorm
#: (its forward is F.layer_norm) and LayerNorm2d (over the channels of NCHW)
NAMED_RULES: dict[str, LayerRule] = {
    "timm.layers.norm.LayerNorm": _NORM,
    "timm.layers.norm.LayerNorm2d": _NORM,
    "timm.layers.std_conv.StdConv2d": LayerRule(std_conv_norm_sq, std_conv_clipped,
                                                state=std_conv_state),
    "timm.layers.std_conv.ScaledStdConv2d": LayerRule(
        std_conv_norm_sq, std_conv_clipped, state=std_conv_state,
        parameters=frozenset({"weight", "bias", "gain"})),
    "timm.layers.layer_scale.LayerScale": LayerRule(
        layer_scale_norm_sq, layer_scale_clipped, parameters=frozenset({"gamma"}),
        check=layer_scale_check),
    "opacus.layers.dp_multihead_attention.SequenceBias": LayerRule(
        sequence_bias_norm_sq, sequence_bias_clipped, parameters=frozenset({"bias"}),
        check=sequence_bias_check),
    "timm.models.vision_transformer.VisionTransformer": LayerRule(
        vit_norm_sq, vit_clipped, parameters=frozenset({"cls_token", "reg_token", "pos_embed"}),
        entry=vit_entry, check=vit_check),
}
#: the named classes whose normalisation runs over dim 1 of an NCHW input
CHANNELS_FIRST = frozenset({"timm.layers.norm.LayerNorm2d"})


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _rule_class(module: nn.Module) -> type | None:
    """Return the first class of ``module``'s MRO that has a rule, None if none."""
    for cls in type(module).__mro__:
        if cls in RULES or _qualified(cls) in NAMED_RULES:
            return cls
    return None


def _rule_of(cls: type) -> LayerRule:
    return RULES[cls] if cls in RULES else NAMED_RULES[_qualified(cls)]


def rule_for(module: nn.Module) -> LayerRule | None:
    """Return the rule for ``module``, None if no rule computes its gradients exactly.

    A subclass of a rule's class gets the rule only if it keeps that class's ``forward`` and
    owns no trainable parameter besides the rule's (what the rule's equations cover: eq. 2 of
    Bu et al. for the layer's own computation, nothing else). A LoRA ``Linear`` with its own
    ``forward`` or a ``LayerNorm`` over another axis computes something else from the same
    recorded input and output gradient.
    """
    cls = _rule_class(module)
    if cls is None or type(module).forward is not cls.forward:
        return None
    return _rule_of(cls)


def channels_first(module: nn.Module) -> bool:
    """Return whether ``module``'s rule normalises over dim 1 (timm's LayerNorm2d)."""
    cls = _rule_class(module)
    return cls is not None and _qualified(cls) in CHANNELS_FIRST


def unsupported_reason(module: nn.Module) -> str | None:
    """Return why book-keeping cannot handle ``module`` exactly, or None if it can."""
    cls = _rule_class(module)
    name = type(module).__name__
    if cls is None:
        return f"no book-keeping rule for {name}"
    if type(module).forward is not cls.forward:
        return f"{name} subclasses {cls.__name__} with its own forward"
    rule = _rule_of(cls)
    extra = sorted(n for n, p in module.named_parameters(recurse=False)
                   if p.requires_grad and n not in rule.parameters)
    if extra:
        return f"{name} has trainable parameters {', '.join(extra)} no rule covers"
    if parametrize.is_parametrized(module):
        return f"{name} computes its weight (a parametrization)"
    for n in rule.parameters:
        value = getattr(module, n, None)
        if value is not None and not isinstance(value, nn.Parameter):
            return f"{name}.{n} is computed, not a parameter (e.g. old-style weight_norm)"
    if module._forward_pre_hooks:  # weight_norm, spectral_norm, pruning compute weights so
        return f"{name} has forward pre-hooks, which may compute its weight"
    if isinstance(module, nn.Embedding) and (module.scale_grad_by_freq or module.sparse):
        return "Embedding with scale_grad_by_freq or sparse gradients"
    if isinstance(module, (nn.Conv1d, nn.Conv2d)) and module.padding_mode not in (
            "zeros", "reflect", "replicate", "circular"):
        return f"{cls.__name__} padding_mode {module.padding_mode!r}"
    return rule.check(module) if rule.check is not None else None
