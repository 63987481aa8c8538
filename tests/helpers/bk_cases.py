"""Tiny cases of every registered model, and the references book-keeping clipping is checked
against (Opacus hooks, clipped and summed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpbench.models import get_model_builder
from dpbench.training.engine.bookkeeping import BookKeepingEngine
from dpbench.training.engine.choice import build_engine
from dpbench.training.engine.materialised import flat_norms
from tests.helpers.engines import ONE_POINT

CLIP = 0.05  # small enough that most examples are clipped


def _ce(model, batch):
    x, y = batch
    out = model(*x) if isinstance(x, tuple) else model(x)
    return F.cross_entropy(out, y, reduction="none")


def _lm_loss(model, batch):
    (ids, mask), = batch
    logits = model(ids, mask)[:, :-1]
    tok = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                          reduction="none")
    return tok.view(ids.shape[0], -1).sum(1)


def _dit_loss(model, batch):
    args, target = batch
    return (model(*args) - target).pow(2).flatten(1).sum(1)


def tiny_case(name: str):
    """Return (model, loss_fn, batch) for ``name`` with tiny inputs (B = 5)."""
    torch.manual_seed(0)
    b = 5
    build = get_model_builder(name)
    if name in ("mlp", "logreg"):
        return build((1, 8, 8), 10), _ce, (torch.randn(b, 1, 8, 8), torch.randint(0, 10, (b,)))
    if name == "cnn2":
        return build((1, 28, 28), 10), _ce, (torch.randn(b, 1, 28, 28), torch.randint(0, 10, (b,)))
    if name == "pretrained":  # the ImageNet ResNet-18 layout, random weights (offline)
        model = build((3, 8, 8), 10, arch="resnet18", weights=False, resolution=16)
        return model, _ce, (torch.randn(b, 3, 8, 8), torch.randint(0, 10, (b,)))
    if name == "causal_lm_lora":  # the offline tiny random Llama with LoRA
        model = build(None)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(std=0.1)
        return model, _lm_loss, ((torch.randint(5, 500, (b, 6)), torch.ones(b, 6,
                                                                             dtype=torch.long)),)
    if name == "resnet18":
        return build((3, 8, 8), 10), _ce, (torch.randn(b, 3, 8, 8), torch.randint(0, 10, (b,)))
    if name == "dit":
        model = build((6, 2), hidden=8, depth=1)
        for p in model.parameters():  # AdaLN-Zero starts at zero: perturb so every path counts
            nn.init.normal_(p, std=0.3)
        length, k = 6, 2
        args = (torch.randn(b, length, k), (torch.rand(b, length, k) < 0.5).float(),
                torch.randint(0, 8, (b,)), torch.randn(b, length, k),
                torch.ones(b, length, k), torch.randn(b, length, 5))
        return model, _dit_loss, (args, torch.randn(b, length, k))
    if name == "minilm_lora":
        model = build(None, 2, layers=[5])
        with torch.no_grad():  # LoRA B starts at zero: make A's gradients non-trivial
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(std=0.1)
        ids = torch.randint(100, 1000, (b, 7))
        mask = torch.ones(b, 7, dtype=torch.long)
        mask[0, 5:] = 0
        return model, _ce, ((ids, mask), torch.randint(0, 2, (b,)))
    pytest.fail(f"model {name!r} is registered but has no tiny case in tests/helpers/bk_cases.py: "
                "add one so book-keeping is checked on it", pytrace=False)


def hooks_reference(model, loss_fn, batch):
    engine = build_engine(model, "hooks")
    grads, _ = engine.per_example(loss_fn, batch)
    norms = flat_norms(grads)
    factors = (CLIP / (norms + 1e-6)).clamp(max=1.0)
    return [torch.einsum("i,i...->...", factors, g) for g in grads], norms


def bk_clipped_sum(model, loss_fn, batch):
    engine = BookKeepingEngine(model)
    sums, norms, factors, _, _ = engine.clipped_sum(
        loss_fn, batch, ONE_POINT, lambda n: (CLIP / (n + 1e-6)).clamp(max=1.0))
    return sums, norms, factors
