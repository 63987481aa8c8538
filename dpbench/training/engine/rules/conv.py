"""Book-keeping's rule for ``nn.Conv2d`` (groups, stride, dilation, padding modes).

A convolution is a linear layer on patches: with ``P_i`` [C k^2, L] example i's patches (the L
output positions as tokens), ``G_i = g_i P_i^T`` (Bu et al., ICML 2023, eq. 2), its norm by
instantiation or by the ghost norm ``<P_i^T P_i, g_i^T g_i>`` (their eq. 4), and the clipped
sum torch's weight gradient with re-weighted output gradients (their eq. 5). Several calls are
concatenated along L. Per user, ``D_u = sum_{i in u} g_i P_i^T`` concatenates the user's
examples' patches along L too (``conv2d_user_norm_sq``), or sums their instantiated ``G_i``.
The helpers are shared with ``conv1d`` and ``std_conv``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.grad import conv2d_weight

from dpbench.training.engine.rules.base import (
    KEEP_INSTANTIATED_ELEMENTS,
    Call,
    Calls,
    Kept,
    LayerRule,
    Tensor,
    UserRows,
    added,
    gram_norm_sq,
    layer_rule,
    sq,
    weighted,
)

#: per-example multiply-adds of a conv weight gradient above which one torch weight-gradient
#: call per example beats the batched im2col matmul (measured on CPU, ResNet-18 vs cnn2)
PER_EXAMPLE_CALL_MACS = 4_000_000
#: the padding modes the rule reads (``_conv_input`` pads as the layer does)
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def padding_refusal(m: nn.Module, cls: type) -> str | None:
    """Return why the conv's padding is not one the rule reads, or None."""
    if m.padding_mode not in PADDING_MODES:
        return f"{cls.__name__} padding_mode {m.padding_mode!r}"
    return None


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


def loops_per_example(device: torch.device, macs: int) -> bool:
    """Whether G_i (eq. 2) takes one weight-gradient call per example, not one batched product:
    on CPU above the threshold only (on an H200, B launches a layer cost 3.4x: docs/engine.md)."""
    return device.type == "cpu" and macs >= PER_EXAMPLE_CALL_MACS


def _per_example_loop(m: nn.Conv2d, calls: Calls, shape: torch.Size) -> Tensor:
    """Return [B, *shape] per-example weight gradients, one torch weight-gradient call each."""
    b = calls[0].g.shape[0]
    out = None
    for c in calls:
        x, padding = _conv_input(m, c.a)
        per = torch.stack([conv2d_weight(x[i:i + 1], shape, c.g[i:i + 1], m.stride, padding,
                                         m.dilation, m.groups) for i in range(b)])
        out = per if out is None else out + per
    return out


def _patch_operands(m: nn.Conv2d, calls: Calls) -> list[tuple[Tensor, Tensor]]:
    """Return per call (patches [B*G, C/G k^2, L], output grads [B*G, O/G, L])."""
    b, o = calls[0].g.shape[:2]
    grp = m.groups
    # one strided copy in the view's own order (einsum's permuting copy is slower on CPU)
    return [(_patches(m, c.a, tuple(c.g.shape[2:])).reshape(
        b * grp, -1, c.g.shape[2] * c.g.shape[3]), c.g.reshape(b * grp, o // grp, -1))
        for c in calls]


def _instantiated(operands: list[tuple[Tensor, Tensor]]) -> Tensor:
    """Return G_i = sum_c g_c P_c^T [B*G, O/G, C/G k^2] (one bmm per call, no concatenation)."""
    return added([torch.bmm(gg, p.transpose(1, 2)) for p, gg in operands])


def conv_weight_per_example(m: nn.Conv2d, calls: Calls, shape: torch.Size) -> Tensor:
    """Return [B, *shape] per-example gradients of a conv's (effective) weight, instantiated."""
    b, o = calls[0].g.shape[:2]
    c_k = shape[1] * shape[2] * shape[3]
    length = sum(c.g.shape[2] * c.g.shape[3] for c in calls)
    if loops_per_example(calls[0].g.device, o * c_k * length):
        return _per_example_loop(m, calls, shape)
    return _instantiated(_patch_operands(m, calls)).view(b, *shape)


def conv_bias_grads(calls: Calls) -> Tensor:
    """Return [B, O] per-example bias gradients sum_c sum_l g_c."""
    dims = tuple(range(2, calls[0].g.dim()))
    return added([c.g.sum(dims) for c in calls])


def _keep(keep: Kept | None, m: nn.Conv2d, weight_grads: Tensor, calls: Calls) -> None:
    """Store the per-example weight (and bias) gradients in ``keep`` if they are small."""
    if keep is None or weight_grads.numel() > KEEP_INSTANTIATED_ELEMENTS:
        return
    keep[m.weight] = weight_grads
    if m.bias is not None and m.bias.requires_grad:
        keep[m.bias] = conv_bias_grads(calls)


def _bias_sq(m: nn.Conv2d, calls: Calls) -> Tensor | float:
    if m.bias is not None and m.bias.requires_grad:
        return conv_bias_grads(calls).pow(2).sum(1)
    return 0.0


def conv_weight_sum(m: nn.Conv2d, c: Call, f: Tensor, shape: torch.Size) -> Tensor:
    """Return sum_i f_i G_i of one call: torch's weight gradient with re-weighted g (eq. 5)."""
    x, padding = _conv_input(m, c.a)
    return conv2d_weight(x, shape, weighted(c.g, f), m.stride, padding, m.dilation, m.groups)


def conv_bias_sum(m: nn.Conv2d, calls: Calls, f: Tensor) -> Tensor:
    """Return sum_i f_i grad_i of the bias."""
    return torch.mv(conv_bias_grads(calls).t(), f.to(calls[0].g.dtype))


def conv2d_norm_sq(m: nn.Conv2d, calls: Calls, keep: Kept | None = None) -> Tensor:
    """Return per-example ||grad W||^2 + ||grad b||^2 of a 2-d convolution.

    The patches [B, C k^2, L] are one copy of a strided view of the padded input (not
    unfold's per-example loop); instantiation is ``G_i = g_i P_i^T`` (one bmm), the ghost norm
    ``<P_i^T P_i, g_i^T g_i>``, whichever costs fewer multiply-adds (Bu et al. eq. 2 and 4 with
    the L output positions as tokens; several calls are concatenated along L). Large layers
    (ResNet stages) on CPU instantiate with torch's weight gradient per example
    (``loops_per_example``). Instantiated gradients small enough are kept for the clipped sum.
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
        if not ghost and loops_per_example(calls[0].g.device, o * c_k * length):
            # large layer on CPU: a per-example weight gradient costs what a whole-batch one does
            per_example = _per_example_loop(m, calls, m.weight.shape)
            _keep(keep, m, per_example, calls)
            return sq(per_example) + _bias_sq(m, calls)
        operands = _patch_operands(m, calls)
        if ghost:  # ghost norm is cheaper: the calls' positions concatenated along L
            p = _cat_spatial([op[0] for op in operands])
            gg = _cat_spatial([op[1] for op in operands])
            per = gram_norm_sq(p.transpose(1, 2), gg.transpose(1, 2))
        else:  # instantiate G_i = sum_c g_c P_c^T [O/G, C/G k^2]
            per_example = _instantiated(operands)
            _keep(keep, m, per_example.view(b, *m.weight.shape), calls)
            per = sq(per_example)
        out = out + per.view(b, grp).sum(1)
    return out + _bias_sq(m, calls)


def conv2d_user_norm_sq(m: nn.Conv2d, calls: Calls, rows: UserRows) -> Tensor:
    """Return per-user ||D_u||^2 of a 2-d convolution's weight and bias: the user is one
    example whose positions are its examples' (Bu et al. eq. 2 and 4 over n_u L positions,
    zero-padded): the ghost norm on the regrouped patches when it costs fewer multiply-adds,
    else ``sum_{i in u} G_i`` instantiated. The bias: ``||sum_{i in u} sum_l g_il||^2``."""
    g0 = calls[0].g
    out = torch.zeros(rows.count, dtype=g0.dtype, device=g0.device)
    if m.weight.requires_grad:
        b, o = g0.shape[:2]
        grp = m.groups
        c_k = m.weight.shape[1] * m.weight.shape[2] * m.weight.shape[3]
        length = rows.width * sum(c.g.shape[2] * c.g.shape[3] for c in calls)
        if length * (c_k + o // grp) <= c_k * (o // grp):  # ghost on the user's positions
            operands = _patch_operands(m, calls)
            p = _cat_spatial([op[0] for op in operands])  # [B*G, C/G k^2, L]
            gg = _cat_spatial([op[1] for op in operands])  # [B*G, O/G, L]
            p_u = _user_positions(rows, p.view(b, grp, *p.shape[1:]))
            g_u = _user_positions(rows, gg.view(b, grp, *gg.shape[1:]))
            out = out + gram_norm_sq(p_u.transpose(1, 2), g_u.transpose(1, 2)).view(
                rows.count, grp).sum(1)
        else:
            out = out + sq(rows.sums(conv_weight_per_example(m, calls, m.weight.shape)))
    if m.bias is not None and m.bias.requires_grad:
        out = out + rows.sums(conv_bias_grads(calls)).pow(2).sum(1)
    return out


def _user_positions(rows: UserRows, x: Tensor) -> Tensor:
    """Return [U*G, K, n_max L] from x [B, G, K, L]: each user's rows along the positions."""
    u = rows.regroup(x)  # [U, n_max, G, K, L]
    count, width, grp, k, length = u.shape
    return u.permute(0, 2, 3, 1, 4).reshape(count * grp, k, width * length)


def conv2d_clipped(m: nn.Conv2d, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
    """Return sum_i f_i grad_i: torch's weight gradient with re-weighted output gradients."""
    out = {}
    if m.weight.requires_grad:
        out[m.weight] = added([conv_weight_sum(m, c, f, m.weight.shape) for c in calls])
    if m.bias is not None and m.bias.requires_grad:
        out[m.bias] = conv_bias_sum(m, calls, f)
    return out


@layer_rule(nn.Conv2d)
class Conv2dRule(LayerRule):
    def norm_sq(self, m: nn.Conv2d, calls: Calls, keep: Kept | None = None) -> Tensor:
        return conv2d_norm_sq(m, calls, keep)

    def clipped(self, m: nn.Conv2d, calls: Calls, f: Tensor) -> dict[nn.Parameter, Tensor]:
        return conv2d_clipped(m, calls, f)

    per_user = True

    def user_norm_sq(self, m: nn.Conv2d, calls: Calls, rows: UserRows) -> Tensor:
        return conv2d_user_norm_sq(m, calls, rows)

    def check(self, m: nn.Module, cls: type) -> str | None:
        return padding_refusal(m, cls)
