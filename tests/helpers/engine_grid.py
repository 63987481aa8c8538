"""Layer grids modelled on Opacus's per-layer tests, run through dpbench's engines (a test helper).

Each family draws its shapes and options from the strategies of Opacus's
``opacus/tests/grad_samples/*_test.py`` (the same integer ranges and choices; ``N = 0`` is
left out: an empty batch never reaches an engine), plus the configurations found wrong by the
independent check: subclasses with their own forward, computed weights, layers whose dim 0 is
not the example, a weight used outside its layer, layers called twice and in-place outputs.

A case is a model mapping a batch-first input ``x`` [N, ...] to an output [N, ...]; example
i's loss is ``<out_i, r_i>`` with fixed random ``r``. ``outcome`` runs a case through an
engine as the loop would and compares its per-example norms and clipped sum with a float64
reference, one example per forward (plain autograd): ``exact``, ``refused`` (a one-line
error before any release), ``wrong`` (ran, off by more than ``WRONG``) or ``crashed``.

Draws come from a ``Draw``: ``RandomDraw`` for counting (``python -m tests.helpers.engine_grid``)
or ``HypothesisDraw`` inside ``hypothesis`` property tests.
"""

from __future__ import annotations

import copy
import math
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.engines import ONE_POINT

#: relative error above which a result that ran is "wrong" (the independent check's bar)
WRONG = 1e-4


class Draw:
    def int(self, lo: int, hi: int) -> int: ...
    def choice(self, options: list): ...

    def bool(self) -> bool:
        return self.choice([False, True])


class RandomDraw(Draw):
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options: list):
        return self.rng.choice(options)


class HypothesisDraw(Draw):
    def __init__(self, data) -> None:
        self.data = data

    def int(self, lo: int, hi: int) -> int:
        import hypothesis.strategies as st
        return self.data.draw(st.integers(lo, hi))

    def choice(self, options: list):
        import hypothesis.strategies as st
        return self.data.draw(st.sampled_from(options))


@dataclass
class Case:
    name: str
    model: nn.Module
    x: torch.Tensor
    #: engines whose rules claim this layer (bk's rules: Linear, Conv1d, Conv2d, Embedding,
    #: LayerNorm, GroupNorm, RMSNorm, timm's LayerNorm2d, StdConv2d, ScaledStdConv2d and
    #: VisionTransformer), for the property tests
    bk_claims: bool = False


class TimeFirst(nn.Module):
    """Applies ``layer`` with dims 0 and 1 swapped (batch_first=False), output batch-first."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x.transpose(0, 1)).transpose(0, 1)


class Folded(nn.Module):
    """Folds the examples into the leading axis of ``layer``'s input: [N, T, ...] -> [N*T, ...]."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x):
        n = x.shape[0]
        return self.layer(x.reshape(-1, *x.shape[2:])).reshape(n, -1)


class ChannelsLast(nn.Module):
    """Feeds ``layer`` its input in the channels_last memory format (as a model may)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x.contiguous(memory_format=torch.channels_last))


def expander(c: int) -> int:
    return c * 2


def shrinker(c: int) -> int:
    return max(1, c // 2)


# ---- families of the bk-claimed layers -----------------------------------------------------
def linear_case(d: Draw) -> Case | None:
    n, z, h, w = d.int(1, 4), d.int(1, 4), d.int(1, 3), d.int(10, 17)
    input_dim, bias, batch_first = d.int(2, 4), d.bool(), d.bool()
    shape = {2: [n, w], 3: [n, z, w], 4: [n, z, h, w]}[input_dim]
    if input_dim == 2 and not batch_first:
        return None  # as Opacus: no time axis to swap
    layer = nn.Linear(w, w + 2, bias=bias)
    model = layer if batch_first else TimeFirst(layer)
    return Case(f"linear{shape} bias={bias} batch_first={batch_first}", model,
                torch.randn(shape), bk_claims=batch_first)


def conv2d_case(d: Draw) -> Case | None:
    n, c, h, w = d.int(1, 4), d.choice([1, 3, 32]), d.int(11, 17), d.int(11, 17)
    mapper = d.choice([expander, shrinker])
    k, stride, padding = d.int(2, 4), d.int(1, 2), d.choice([0, 2, "same", "valid"])
    dilation, groups = d.int(1, 3), d.int(1, 16)
    channels_last = d.choice([False, False, False, True])
    out = mapper(c)
    if (padding == "same" and stride != 1) or c % groups or out % groups:
        return None
    conv = nn.Conv2d(c, out, k, stride=stride, padding=padding, dilation=dilation,
                     groups=groups)
    model = ChannelsLast(conv) if channels_last else conv
    return Case(f"conv2d N={n} C={c}->{out} k={k} s={stride} p={padding} d={dilation} "
                f"g={groups} channels_last={channels_last}", model, torch.randn(n, c, h, w),
                bk_claims=True)


def embedding_case(d: Draw) -> Case | None:
    n, t, q, r = d.int(1, 4), d.int(1, 5), d.int(1, 4), d.int(1, 2)
    v, dim_e, dim, batch_first = d.int(2, 32), d.int(10, 17), d.int(2, 4), d.bool()
    extra = d.choice(["", "", "padding_idx", "scale_grad_by_freq"])
    shape = {2: [n, t], 3: [n, t, q], 4: [n, t, q, r]}[dim]
    emb = nn.Embedding(v, dim_e, padding_idx=0 if extra == "padding_idx" else None,
                       scale_grad_by_freq=extra == "scale_grad_by_freq")
    model = emb if batch_first else TimeFirst(emb)
    return Case(f"embedding{shape} V={v} {extra} batch_first={batch_first}", model,
                torch.randint(0, v, shape), bk_claims=batch_first and extra != "scale_grad_by_freq")


def _norm_shapes(n, z, h, w, input_dim, norm_dim):
    if norm_dim >= input_dim:
        return None
    x_shape = {2: [n, w], 3: [n, z, w], 4: [n, z, h, w]}[input_dim]
    return x_shape[-norm_dim:], x_shape


def _trailing_norm_case(d: Draw, layer: type[nn.Module], label: str,
                        bk_claims: bool = False) -> Case | None:
    """A norm over the trailing dims (LayerNorm, RMSNorm), drawn as Opacus's grids draw it."""
    n, z, h, w = d.int(1, 4), d.int(1, 4), d.int(1, 3), d.int(5, 10)
    shapes = _norm_shapes(n, z, h, w, d.int(2, 4), d.int(1, 3))
    if shapes is None:
        return None
    norm = layer(shapes[0], elementwise_affine=True)
    _randomise(norm)
    return Case(f"{label}{shapes[1]} over {shapes[0]}", norm, torch.randn(shapes[1]),
                bk_claims=bk_claims)


def layer_norm_case(d: Draw) -> Case | None:
    return _trailing_norm_case(d, nn.LayerNorm, "layer_norm", bk_claims=True)


def group_norm_case(d: Draw) -> Case | None:
    n, c, h, w = d.int(1, 4), d.int(1, 8), d.int(5, 10), d.int(4, 8)
    groups = d.choice([1, 4, "C"])
    groups = c if groups == "C" else groups
    if c % groups:
        return None
    norm = nn.GroupNorm(groups, c, affine=True)
    _randomise(norm)
    return Case(f"group_norm N={n} C={c} G={groups}", norm, torch.randn(n, c, h, w),
                bk_claims=True)


# ---- timm's layers with bk rules (Opacus has no grid for them: drawn as its Conv2d's) ------
def layer_norm2d_case(d: Draw) -> Case | None:
    from timm.layers import LayerNorm2d
    # C >= 2: over one channel x_hat is 0 and the weight's gradient is rounding noise alone
    n, c, h, w = d.int(1, 4), d.int(2, 8), d.int(1, 6), d.int(1, 6)
    norm = LayerNorm2d(c, affine=True)
    _randomise(norm)
    return Case(f"timm.LayerNorm2d N={n} C={c} H={h} W={w}", norm, torch.randn(n, c, h, w),
                bk_claims=True)


def std_conv2d_case(d: Draw) -> Case | None:
    from timm.layers import ScaledStdConv2d, StdConv2d
    n, c, h, w = d.int(1, 4), d.choice([1, 3, 32]), d.int(11, 17), d.int(11, 17)
    mapper = d.choice([expander, shrinker])
    k, stride, padding = d.int(2, 4), d.int(1, 2), d.choice([0, 2, "same", "valid"])
    dilation, groups = d.int(1, 3), d.int(1, 16)
    scaled, bias = d.bool(), d.bool()
    out = mapper(c)
    if (padding == "same" and stride != 1) or c % groups or out % groups:
        return None
    cls = ScaledStdConv2d if scaled else StdConv2d
    conv = cls(c, out, k, stride=stride, padding=padding, dilation=dilation, groups=groups,
               bias=bias)
    if scaled:
        with torch.no_grad():
            conv.gain.normal_(1.0, 0.3)
    return Case(f"timm.{cls.__name__} N={n} C={c}->{out} k={k} s={stride} p={padding} "
                f"d={dilation} g={groups} bias={bias}", conv, torch.randn(n, c, h, w),
                bk_claims=True)


class ViTFeatures(nn.Module):
    """A tiny timm VisionTransformer, its tokens as the output (every token's gradient counts)."""

    def __init__(self, **settings) -> None:
        super().__init__()
        import timm
        settings.setdefault("global_pool", "token" if settings.get("class_token", True)
                            else "avg")  # token pooling needs the class token
        self.vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0,
                                     img_size=16, patch_size=8, depth=1, embed_dim=8,
                                     num_heads=2, **settings)
        with torch.no_grad():  # the tokens start at small values: make every path count
            for name, p in self.vit.named_parameters():
                if name in ("cls_token", "reg_token", "pos_embed"):
                    p.normal_()

    def forward(self, x):
        return self.vit.forward_features(x)


def vit_case(d: Draw) -> Case | None:
    n = d.int(1, 4)
    settings = {"class_token": d.bool(), "reg_tokens": d.choice([0, 0, 2]),
                "no_embed_class": d.bool(), "pos_embed": d.choice(["learn", "learn", "none"]),
                "init_values": d.choice([None, 0.5])}
    if not settings["class_token"] and not settings["reg_tokens"] \
            and settings["pos_embed"] == "none":
        return None  # nothing of the ViT's own
    label = " ".join(f"{k}={v}" for k, v in settings.items())
    return Case(f"timm.VisionTransformer N={n} {label}", ViTFeatures(**settings),
                torch.randn(n, 3, 16, 16), bk_claims=True)


# ---- Opacus's other families (bk has rules for Conv1d and RMSNorm; auto falls back for the
# rest) ---------------------------------------------------------------------------------------
def conv1d_case(d: Draw) -> Case | None:
    n, c, w = d.int(1, 4), d.choice([1, 3, 32]), d.int(6, 10)
    mapper, k, stride = d.choice([expander, shrinker]), d.int(2, 3), d.int(1, 2)
    padding, dilation, groups = d.choice([0, 1, 2, "same", "valid"]), d.int(1, 2), d.int(1, 12)
    out = mapper(c)
    if (padding == "same" and stride != 1) or c % groups or out % groups:
        return None
    return Case(f"conv1d N={n} C={c}->{out} k={k} s={stride} p={padding} d={dilation} "
                f"g={groups}", nn.Conv1d(c, out, k, stride=stride, padding=padding,
                                         dilation=dilation, groups=groups),
                torch.randn(n, c, w), bk_claims=True)


def conv3d_case(d: Draw) -> Case | None:
    n, c = d.int(1, 4), d.choice([1, 3])
    dd, h, w = d.int(3, 6), d.int(6, 10), d.int(6, 10)
    k, stride = d.choice([2, 3, (1, 2, 3)]), d.choice([1, 2, (1, 2, 3)])
    padding, groups = d.choice([0, 2, (1, 2, 3), "same", "valid"]), d.int(1, 3)
    out = d.choice([expander, shrinker])(c)
    if (padding == "same" and stride != 1) or c % groups or out % groups:
        return None
    return Case(f"conv3d N={n} C={c}->{out} k={k} s={stride} p={padding} g={groups}",
                nn.Conv3d(c, out, k, stride=stride, padding=padding, groups=groups),
                torch.randn(n, c, dd, h, w))


def instance_norm_case(d: Draw) -> Case | None:
    n, c, dims = d.int(1, 4), d.int(1, 3), d.int(1, 3)
    cls = {1: nn.InstanceNorm1d, 2: nn.InstanceNorm2d, 3: nn.InstanceNorm3d}[dims]
    spatial = [d.int(4, 8) for _ in range(dims)]
    norm = cls(c, affine=True, track_running_stats=False)
    _randomise(norm)
    return Case(f"instance_norm{dims}d N={n} C={c} {spatial}", norm, torch.randn(n, c, *spatial))


def rms_norm_case(d: Draw) -> Case | None:
    return _trailing_norm_case(d, nn.RMSNorm, "rms_norm", bk_claims=True)


class SequenceBiasModel(nn.Module):
    def __init__(self, d_model: int, batch_first: bool) -> None:
        super().__init__()
        from opacus.layers import SequenceBias
        self.batch_first = batch_first
        self.bias = SequenceBias(d_model, batch_first=batch_first)

    def forward(self, x):
        if self.batch_first:
            return self.bias(x)
        return self.bias(x.transpose(0, 1)).transpose(0, 1)


def sequence_bias_case(d: Draw) -> Case | None:
    n, t, dim, batch_first = d.int(1, 4), d.int(10, 20), d.int(4, 8), d.bool()
    model = SequenceBiasModel(dim, batch_first)
    with torch.no_grad():
        model.bias.bias.normal_()
    return Case(f"sequence_bias N={n} T={t} D={dim} batch_first={batch_first}", model,
                torch.randn(n, t, dim), bk_claims=batch_first)


class EmbeddingBagModel(nn.Module):
    """One bag per example: x [N, S] indices, a bag each (offsets 0, S, 2S, ...)."""

    def __init__(self, v: int, dim: int, mode: str) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(v, dim, mode=mode)

    def forward(self, x):
        n, s = x.shape
        return self.bag(x.reshape(-1), torch.arange(n) * s)


def embedding_bag_case(d: Draw) -> Case | None:
    n, size, v, dim, mode = d.int(1, 4), d.int(3, 7), d.int(10, 32), d.int(10, 17), d.choice(
        ["sum", "mean"])
    return Case(f"embedding_bag N={n} S={size} {mode}", EmbeddingBagModel(v, dim, mode),
                torch.randint(0, v, (n, size)))


class RNNModel(nn.Module):
    def __init__(self, rnn: nn.Module, batch_first: bool) -> None:
        super().__init__()
        self.rnn, self.batch_first = rnn, batch_first

    def forward(self, x):
        out, _ = self.rnn(x if self.batch_first else x.transpose(0, 1))
        return out if self.batch_first else out.transpose(0, 1)


def dp_rnn_case(d: Draw) -> Case | None:
    from opacus.layers import DPGRU, DPLSTM, DPRNN
    cls = d.choice([DPRNN, DPGRU, DPLSTM])
    n, t, dim, hidden = d.int(1, 3), d.int(1, 3), d.int(4, 5), d.int(8, 10)
    layers, bias, batch_first, bidir = d.choice([1, 2]), d.bool(), d.bool(), d.bool()
    rnn = cls(dim, hidden, num_layers=layers, bias=bias, batch_first=batch_first,
              bidirectional=bidir)
    return Case(f"{cls.__name__} N={n} T={t} layers={layers} bias={bias} "
                f"batch_first={batch_first} bidirectional={bidir}", RNNModel(rnn, batch_first),
                torch.randn(n, t, dim))


class AttentionModel(nn.Module):
    def __init__(self, attn: nn.Module, batch_first: bool) -> None:
        super().__init__()
        self.attn, self.batch_first = attn, batch_first

    def forward(self, x):
        x = x if self.batch_first else x.transpose(0, 1)
        out, _ = self.attn(x, x, x)
        return out if self.batch_first else out.transpose(0, 1)


def attention_case(d: Draw) -> Case | None:
    from opacus.layers import DPMultiheadAttention
    n, t, heads = d.int(1, 4), d.int(16, 20), d.choice([1, 2])
    bias, add_bias_kv, add_zero_attn = d.bool(), d.bool(), d.bool()
    cls = d.choice([DPMultiheadAttention, nn.MultiheadAttention])
    batch_first = d.bool()
    attn = cls(4, heads, bias=bias, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
               batch_first=batch_first)
    if add_bias_kv:
        with torch.no_grad():
            for p in attn.parameters():
                if p.dim() == 3:
                    p.normal_()
    return Case(f"{cls.__name__} N={n} T={t} heads={heads} bias={bias} "
                f"add_bias_kv={add_bias_kv} add_zero_attn={add_zero_attn} "
                f"batch_first={batch_first}", AttentionModel(attn, batch_first),
                torch.randn(n, t, 4))


# ---- the classes found silently wrong, and the runtime refusals ----------------------------
class DoubledLinear(nn.Linear):
    """A Linear subclass whose forward uses 2 W (its own forward, the base's parameters)."""

    def forward(self, x):
        return F.linear(x, 2 * self.weight, self.bias)


class TiedOutput(nn.Module):
    """A language-model head tied to the embedding: ``F.linear(h, emb.weight)``."""

    def __init__(self, v: int, dim: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(v, dim)
        self.mix = nn.Linear(dim, dim)

    def forward(self, x):
        return F.linear(torch.tanh(self.mix(self.emb(x))), self.emb.weight)


class CalledTwice(nn.Module):
    def __init__(self, layer: nn.Module, between: nn.Module | None = None) -> None:
        super().__init__()
        self.layer, self.between = layer, between or nn.Tanh()

    def forward(self, x):
        return self.layer(self.between(self.layer(x)))


class InPlaceAfter(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, dim), nn.ReLU(inplace=True), nn.Linear(
            dim, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class FoldedMultiplicity(nn.Module):
    """Augmentation multiplicity as one forward: [N, K, C, H, W] -> [N*K, ...] -> mean over K."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, 4, 3)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        n, k = x.shape[:2]
        h = self.conv(x.reshape(n * k, *x.shape[2:])).mean((2, 3))
        return self.fc(h).reshape(n, k, -1).mean(1)


class FoldedEmbedding(nn.Module):
    def __init__(self, v: int, dim: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(v, dim)

    def forward(self, x):
        return self.emb(x.reshape(-1)).reshape(x.shape[0], -1)


def _randomise(module: nn.Module) -> None:
    """Give a layer non-trivial values (LoRA's B and norms' affine start at 0 / 1)."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.5)


def _lora_cases(d: Draw) -> list[Case]:
    try:
        import loralib
    except ImportError:
        return []
    out = []
    n, t, w = d.int(1, 4), d.int(1, 4), d.int(10, 17)
    lin = loralib.Linear(w, w + 2, r=d.choice([1, 2, 4]), lora_alpha=2)
    _randomise_lora(lin)
    out.append(Case(f"loralib.Linear N={n} T={t}", lin, torch.randn(n, t, w)))
    merged = loralib.MergedLinear(w, 3 * w, r=2, enable_lora=[True, False, True])
    _randomise_lora(merged)
    out.append(Case(f"loralib.MergedLinear N={n} T={t}", merged, torch.randn(n, t, w)))
    emb = loralib.Embedding(d.int(2, 32), w, r=2)
    _randomise_lora(emb)
    out.append(Case(f"loralib.Embedding N={n} T={t}", emb,
                    torch.randint(0, emb.num_embeddings, (n, t))))
    return out


def _randomise_lora(module: nn.Module) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.3)


def _timm_cases(d: Draw) -> list[Case]:
    try:
        from timm.layers import LayerNorm2d, ScaledStdConv2d, StdConv2d
        from timm.layers.conv2d_same import Conv2dSame
    except ImportError:
        return []
    n, c, h, w = d.int(1, 4), d.choice([3, 4, 8]), d.int(5, 9), d.int(5, 9)
    x = torch.randn(n, c, h, w)
    ln = LayerNorm2d(c)
    _randomise(ln)
    out = [Case(f"timm.LayerNorm2d N={n} C={c} H={h} W={w}", ln, x),
           Case(f"timm.LayerNorm2d N={n} C=W={w}", _randomised(LayerNorm2d(w)),
                torch.randn(n, w, h, w))]
    std = StdConv2d(c, 6, 3, padding=1)
    out.append(Case(f"timm.StdConv2d N={n} C={c}", std, x))
    scaled = ScaledStdConv2d(c, 6, 3, padding=1)
    with torch.no_grad():
        scaled.gain.normal_(1.0, 0.3)
    out.append(Case(f"timm.ScaledStdConv2d N={n} C={c}", scaled, x))
    out.append(Case(f"timm.Conv2dSame N={n} C={c} s=2", Conv2dSame(c, 4, 3, stride=2), x))
    return out


def _randomised(module: nn.Module) -> nn.Module:
    _randomise(module)
    return module


def special_cases(d: Draw) -> list[Case]:
    """The wrong-on-the-base-code classes and the runtime refusals, one draw of each."""
    n, t, w = d.int(1, 4), d.int(2, 5), d.int(10, 17)
    v = d.int(4, 32)
    cases = [
        Case(f"Linear subclass using 2W N={n}", DoubledLinear(w, 3), torch.randn(n, w)),
        Case(f"old-style weight_norm Linear N={n}",
             nn.utils.weight_norm(nn.Linear(w, 3)), torch.randn(n, w)),
        Case(f"old-style spectral_norm Linear N={n}",
             nn.utils.spectral_norm(nn.Linear(w, 3)), torch.randn(n, w)),
        Case(f"parametrizations.weight_norm Linear N={n}",
             nn.utils.parametrizations.weight_norm(nn.Linear(w, 3)), torch.randn(n, w)),
        Case(f"old-style weight_norm Conv2d N={n}",
             nn.utils.weight_norm(nn.Conv2d(3, 4, 3)), torch.randn(n, 3, 7, 7)),
        Case(f"time-first Linear N={n} T=N", TimeFirst(nn.Linear(w, 3)), torch.randn(n, n, w)),
        Case(f"time-first Linear N={n} T={t}", TimeFirst(nn.Linear(w, 3)), torch.randn(n, t, w)),
        Case(f"time-first Embedding N={n} T=N", TimeFirst(nn.Embedding(v, 5)),
             torch.randint(0, v, (n, n))),
        Case(f"folded emb(x.reshape(-1)) N={n} T={t}", FoldedEmbedding(v, 5),
             torch.randint(0, v, (n, t))),
        Case(f"folded Linear [N*T] N={n} T={t}", Folded(nn.Linear(w, 3)), torch.randn(n, t, w)),
        Case(f"augmentation multiplicity [N*K] N={n} K={t}", FoldedMultiplicity(3),
             torch.randn(n, t, 3, 6, 6)),
        Case(f"tied F.linear(h, emb.weight) N={n} T={t}", TiedOutput(v, 6),
             torch.randint(0, v, (n, t))),
        Case(f"Linear called twice N={n}", CalledTwice(nn.Linear(w, w)), torch.randn(n, w)),
        Case(f"Conv2d called twice N={n}", CalledTwice(nn.Conv2d(3, 3, 3, padding=1)),
             torch.randn(n, 3, 6, 6)),
        Case(f"Embedding called twice N={n}", EmbeddingTwice(v, 5), torch.randint(0, v, (n, t))),
        Case(f"LayerNorm called twice N={n}", CalledTwice(_randomised(nn.LayerNorm(w))),
             torch.randn(n, w)),
        Case(f"in-place ReLU after Linear N={n}", InPlaceAfter(w), torch.randn(n, w)),
    ]
    return cases + _lora_cases(d) + _timm_cases(d)


class EmbeddingTwice(nn.Module):
    """Two lookups of one table, both in the loss."""

    def __init__(self, v: int, dim: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(v, dim)

    def forward(self, x):
        return self.emb(x) + self.emb((x + 1) % self.emb.num_embeddings)


FAMILIES: dict[str, Callable[[Draw], Case | None]] = {
    "linear": linear_case, "conv2d": conv2d_case, "embedding": embedding_case,
    "layer_norm": layer_norm_case, "group_norm": group_norm_case,
    "conv1d": conv1d_case, "conv3d": conv3d_case, "instance_norm": instance_norm_case,
    "rms_norm": rms_norm_case, "layer_norm2d": layer_norm2d_case,
    "std_conv2d": std_conv2d_case, "vit": vit_case, "sequence_bias": sequence_bias_case,
    "embedding_bag": embedding_bag_case, "dp_rnn": dp_rnn_case, "attention": attention_case,
}
BK_FAMILIES = ("linear", "conv2d", "embedding", "layer_norm", "group_norm", "conv1d", "rms_norm",
               "layer_norm2d", "std_conv2d", "vit")


# ---- running a case ------------------------------------------------------------------------
def clone(model: nn.Module) -> nn.Module:
    """Return a deep copy of ``model``; old-style weight/spectral norm keep a computed weight
    attribute that ``deepcopy`` refuses, so it is dropped and recomputed in the copy."""
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm
    removed = []
    for m in model.modules():
        for hook in m._forward_pre_hooks.values():
            if isinstance(hook, (WeightNorm, SpectralNorm)) and hook.name in m.__dict__:
                removed.append((m, hook.name, m.__dict__.pop(hook.name)))
    try:
        out = copy.deepcopy(model)
    finally:
        for m, name, value in removed:
            setattr(m, name, value)
    for m in out.modules():
        for hook in m._forward_pre_hooks.values():
            if isinstance(hook, WeightNorm):
                setattr(m, hook.name, hook.compute_weight(m))
            elif isinstance(hook, SpectralNorm):
                setattr(m, hook.name, hook.compute_weight(m, do_power_iteration=False))
    return out


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    """Example i's loss <out_i, r_i>."""
    x, r = batch[0], batch[1]
    out = model(x)
    return (out * r).reshape(out.shape[0], -1).sum(1)


def batch_of(case: Case, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = clone(case.model)(case.x)
    g = torch.Generator().manual_seed(seed)
    return case.x, torch.randn(out.shape, generator=g)


def reference(case: Case, batch) -> list[list[torch.Tensor]]:
    """Float64 per-example gradients, one example per forward."""
    model = clone(case.model).double()
    x, r = batch
    x = x.double() if x.is_floating_point() else x
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(len(x)):
        loss = loss_fn(model, (x[i:i + 1], r[i:i + 1].double())).sum()
        g = torch.autograd.grad(loss, params, allow_unused=True)
        out.append([torch.zeros_like(p) if v is None else v for p, v in zip(params, g)])
    return out


def engine_outputs(engine, batch, clip: float):
    """Return (norms, clipped sums) as the loop's release computes them (flat clipping at C),
    through the engine protocol's one call."""
    def factors(norms):
        return (clip / norms.clamp_min(1e-30)).clamp(max=1.0)

    sums, norms, _, _, _ = engine.clipped_sum(loss_fn, batch, ONE_POINT, factors)
    return norms, sums


def build(case: Case, mode: str):
    """Return the engine the loop would run for ``mode`` (with the per-run check if present)."""
    from torch.utils.data import TensorDataset

    from dpbench.methods.dpsgd import DPSGD
    from dpbench.training.engine.check import EngineVerifier
    from dpbench.training.engine.choice import build_verified_engine

    data = TensorDataset(*batch_of(case))
    verifier = EngineVerifier(case.model, loss_fn, data, torch.device("cpu"))
    engine, _, _ = build_verified_engine(mode, case.model, DPSGD.configured(), None, verifier)
    return engine


def refusal_types() -> tuple[type, ...]:
    from opacus.validators.errors import UnsupportedModuleError

    from dpbench.errors import ConfigError, PrivacyError
    return ConfigError, PrivacyError, UnsupportedModuleError


@dataclass
class Run:
    """One case through one engine: what ran (or why not) and the float64 reference."""

    status: str  # "ran", "refused" or "crashed"
    engine: str  # the engine that ran, or the error's first line
    clip: float
    ref_norms: torch.Tensor
    ref_sums: list[torch.Tensor]
    norms: torch.Tensor | None = None
    sums: list[torch.Tensor] | None = None
    engine_obj: object = None
    batch: tuple | None = None
    reduction: int = 1


def run_case(case: Case, mode: str) -> Run:
    """Build ``mode``'s engine as the loop would, run the case's batch, keep the reference."""
    case = Case(case.name, clone(case.model), case.x)
    batch = batch_of(case)
    ref = reference(case, batch)
    ref_norms = torch.stack([torch.sqrt(sum((g.pow(2).sum() for g in row),
                                            torch.zeros((), dtype=torch.float64)))
                             for row in ref])
    clip = float(ref_norms.median()) or 1.0
    f = (clip / ref_norms.clamp_min(1e-300)).clamp(max=1.0)
    ref_sums = [sum(f[i] * ref[i][j] for i in range(len(ref))) for j in range(len(ref[0]))]
    run = Run("ran", "", clip, ref_norms, ref_sums, batch=batch,
              reduction=max(case.x[0].numel(), batch[1][0].numel()))
    try:
        engine = build(case, mode)
        run.norms, run.sums = engine_outputs(engine, batch, clip)
    except refusal_types() as err:
        run.status, run.engine = "refused", str(err).splitlines()[0][:200]
        return run
    except Exception as err:  # noqa: BLE001 - counted
        run.status = "crashed"
        run.engine = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        return run
    run.engine, run.engine_obj = engine.mode, engine
    return run


def outcome(case: Case, mode: str) -> tuple[str, float, str]:
    """Return (exact | refused | wrong | crashed, worst relative error, engine or message)."""
    run = run_case(case, mode)
    if run.status != "ran":
        return run.status, math.nan, run.engine
    if run.norms.shape != run.ref_norms.shape:
        return "wrong", math.inf, f"{run.engine}: {run.norms.shape[0]} norms for " \
                                  f"{len(run.ref_norms)}"
    scale = float(run.ref_norms.max()) or 1.0
    errs = [float((run.norms.double() - run.ref_norms).abs().max()) / scale]
    whole = math.sqrt(sum(float(s.pow(2).sum()) for s in run.ref_sums)) or 1.0
    errs += [float((s.double() - r).norm()) / max(float(r.norm()), 1e-3 * whole)
             for s, r in zip(run.sums, run.ref_sums)]
    worst = max(errs)
    return ("exact" if worst <= WRONG else "wrong"), worst, run.engine


def grid(per_family: int, seed: int = 0) -> list[Case]:
    """Return ``per_family`` valid draws of each family, plus the special cases (seeded)."""
    torch.manual_seed(seed)
    d = RandomDraw(seed)
    cases: list[Case] = []
    for family in FAMILIES.values():
        got, tries = 0, 0
        while got < per_family and tries < per_family * 20:
            tries += 1
            case = family(d)
            if case is not None:
                cases.append(case)
                got += 1
    for _ in range(max(1, per_family // 10)):
        cases += special_cases(d)
    return cases


def main(argv: list[str]) -> None:
    per_family = int(argv[1]) if len(argv) > 1 else 20
    modes = argv[2].split(",") if len(argv) > 2 else ["bk", "hooks", "auto"]
    cases = grid(per_family)
    counts = {m: Counter() for m in modes}
    for case in cases:
        for mode in modes:
            result, err, what = outcome(case, mode)
            counts[mode][result] += 1
            if result in ("wrong", "crashed") or "-v" in argv:
                print(f"{mode:6s} {result:8s} {err:9.2g} {case.name} [{what}]", flush=True)
    print(f"{len(cases)} configurations")
    for mode in modes:
        print(mode, dict(sorted(counts[mode].items())))


if __name__ == "__main__":
    main(sys.argv)
