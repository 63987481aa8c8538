"""Per-example gradients of every registered model equal one-at-a-time gradients.

ModuleValidator passing is not enough (stock torchvision ResNet-18 passes and then fails under
Opacus): each model runs a real DP step in each grad-sample mode it supports.
"""

from __future__ import annotations

import pytest
import torch
from opacus.validators import ModuleValidator

from dpbench.models import get_model_builder, model_names
from dpbench.tasks import get_task
from dpbench.training.per_example import PerExampleGradients, flat_norms

#: input shape per classification model for this check; models of other tasks test themselves
SHAPES = {"mlp": (1, 8, 8), "logreg": (1, 8, 8), "cnn2": (1, 28, 28), "resnet18": (3, 32, 32)}
CLASSIFICATION_MODELS = [m for m in model_names() if m in SHAPES]


def test_every_image_model_has_a_shape():
    assert {"mlp", "logreg", "cnn2", "resnet18"} <= set(CLASSIFICATION_MODELS)


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ghost"])
@pytest.mark.parametrize("name", CLASSIFICATION_MODELS)
def test_per_example_gradients_match_one_at_a_time(name, mode):
    torch.manual_seed(0)
    shape = SHAPES[name]
    net = get_model_builder(name)(shape, 10)
    assert ModuleValidator.validate(net, strict=False) == []
    n = 3 if name == "resnet18" else 5
    x, y = torch.randn(n, *shape), torch.randint(0, 10, (n,))
    task = get_task("classification")()
    reference = []
    for i in range(n):
        net.zero_grad()
        task.per_example_loss(net, (x[i:i + 1], y[i:i + 1])).sum().backward()
        reference.append([p.grad.detach().clone() for p in net.parameters()])
    ref_norms = torch.stack([flat_norms([g.unsqueeze(0) for g in r])[0] for r in reference])
    net.zero_grad()
    engine = PerExampleGradients(net, mode)
    if mode == "ghost":
        sums, norms, *_ = engine.ghost_clipped_sum(task.per_example_loss, (x, y),
                                                     lambda nr: torch.ones_like(nr))
        torch.testing.assert_close(norms, ref_norms, rtol=1e-4, atol=1e-6)
        for s, *per in zip(sums, *reference):
            torch.testing.assert_close(s, torch.stack(per).sum(0), rtol=1e-4, atol=1e-6)
        return
    grads, _ = engine.per_example(task.per_example_loss, (x, y))
    for g, *per in zip(grads, *reference):
        torch.testing.assert_close(g, torch.stack(per), rtol=1e-4, atol=1e-6)


def test_stock_resnet_would_fail_but_ours_trains_a_step():
    """Our ResNet-18 (GroupNorm, out-of-place ops) takes a full DP step under Opacus hooks."""
    torch.manual_seed(0)
    net = get_model_builder("resnet18")((3, 32, 32), 10)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())
    engine = PerExampleGradients(net, "hooks")
    grads, _ = engine.per_example(get_task("classification")().per_example_loss,
                                  (torch.randn(2, 3, 32, 32), torch.tensor([1, 2])))
    assert all(torch.isfinite(g).all() for g in grads)
