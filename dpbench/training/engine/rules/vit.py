"""Book-keeping's rule for parameters outside layers: timm's ``VisionTransformer``'s own
``cls_token``, ``reg_token`` and ``pos_embed``.

ViT's input ``z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos`` (Dosovitskiy et al. 2021,
eq. 1): in timm's ``_pos_embed`` the class (and register) tokens are concatenated before the
patch tokens and ``pos_embed`` is added (before or after the concatenation,
``no_embed_class``). The rule reads ``g = dL/dz`` where z enters the network (``entry``):
example i's gradient of ``pos_embed`` is ``g_i`` itself, that of a prepended token ``g_i`` at
its position; sums over the broadcast (batch) dim are never taken.
"""

from __future__ import annotations

from torch import nn

from dpbench.training.engine.rules.base import Calls, InstantiatedRule, Tensor, layer_rule


@layer_rule("timm.models.vision_transformer.VisionTransformer")
class ViTRule(InstantiatedRule):
    parameters = frozenset({"cls_token", "reg_token", "pos_embed"})

    def entry(self, m: nn.Module) -> nn.Module:
        """Return the submodule whose input is where ViT's own parameters have entered: the
        sum z goes into ``pos_drop``; without a position embedding the concatenation goes into
        ``patch_drop`` as it is."""
        return m.pos_drop if m.pos_embed is not None else m.patch_drop

    def grads(self, m: nn.Module, calls: Calls) -> dict[nn.Parameter, Tensor]:
        """Return per-example gradients of ``cls_token``, ``reg_token`` and ``pos_embed`` from
        ``g`` [B, T, D] at the entry (``g_i[prefix:]`` for ``pos_embed`` when it skips the
        prefix tokens)."""
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
            out[m.reg_token] = g[:, start:start + m.reg_token.shape[1]].reshape(
                b, *m.reg_token.shape)
        if m.pos_embed is not None and m.pos_embed.requires_grad:
            pos = g[:, prefix:] if m.no_embed_class else g
            out[m.pos_embed] = pos.reshape(b, *m.pos_embed.shape)
        return out

    def check(self, m: nn.Module, cls: type) -> str | None:
        """Return why the ViT's own parameters are not where ``entry`` reads them, or None."""
        for name in ("forward_features", "_pos_embed"):
            if getattr(type(m), name) is not getattr(cls, name):
                return f"{type(m).__name__} overrides {name}"
        if m.dynamic_img_size:
            return "VisionTransformer with dynamic_img_size (pos_embed is resampled in the " \
                   "forward)"
        if any(True for _ in self.entry(m).parameters()):
            return "VisionTransformer whose pos_drop / patch_drop has parameters"
        return None
