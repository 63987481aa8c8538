"""The shared grid of the per-rule tests (a test helper, imported by ``test_<rule>.py``).

A rule's test draws cases from the Opacus-modelled families of ``tests/helpers/engine_grid.py``
(or builds one), runs them through book-keeping as the loop does (the engine built and checked
against plain autograd before any release) and compares the per-example norms and the clipped
sum with the float64 one-example-at-a-time reference (``tests/helpers/grid_checks.py``).
"""

from __future__ import annotations

import copy
import functools

import torch
from torch import nn

from dpbench.training.engine.rules import Call, rule_for, unsupported_reason
from tests.helpers import engine_grid as families
from tests.helpers.grid_checks import assert_exact
from tests.helpers.numerics import assert_matches_reference

Case = families.Case


@functools.cache
def draws(family: str, count: int, seed: int = 0) -> tuple[Case, ...]:
    """Return the first ``count`` valid draws of ``family`` that book-keeping's rules claim
    (seeded, Opacus's strategies; a time-first layer is the engine's dim-0 check's)."""
    torch.manual_seed(seed)
    draw = families.RandomDraw(seed)
    out: list[Case] = []
    for _ in range(count * 20):
        case = families.FAMILIES[family](draw)
        if case is not None and case.bk_claims:
            out.append(case)
        if len(out) == count:
            return tuple(out)
    raise AssertionError(f"fewer than {count} valid {family} draws")


def assert_bk_exact(case: Case, mode: str = "bk") -> None:
    """Assert ``case`` runs under book-keeping and matches the float64 reference."""
    run = families.run_case(case, mode)
    assert run.status == "ran", f"{case.name}: {run.status}: {run.engine}"
    assert run.engine == "bk", f"{case.name}: ran {run.engine}, not bk"
    assert_exact(run, case.name)


def draw(family: str, i: int, count: int = 3) -> Case:
    """Return draw ``i`` of ``draws(family, count)`` (drawn inside the test, not at
    collection)."""
    return draws(family, count)[i]


def assert_refused(layer: nn.Module, why: str, x: torch.Tensor | None = None) -> None:
    """Assert the rule's structural checks refuse ``layer`` with a reason containing ``why``
    (and, given an input, that the bk engine refuses it before any release)."""
    reason = unsupported_reason(layer)
    assert reason is not None and why in reason, reason
    if x is not None:
        run = families.run_case(Case(f"refused {type(layer).__name__}", layer, x), "bk")
        assert run.status == "refused" and why in run.engine, run.engine


def assert_called_twice_refused(case: Case) -> None:
    """Assert a layer whose rule does not concatenate calls (``concat_calls``) is refused by
    bk when called twice in one forward, and that ``auto`` runs it exactly elsewhere."""
    run = families.run_case(case, "bk")
    assert run.status == "refused" and "is called 2 times in one forward" in run.engine, \
        run.engine
    assert families.outcome(case, "auto")[0] == "exact"


def assert_rule(layer: nn.Module, rule_type: type) -> None:
    """Assert ``layer`` gets exactly the rule ``rule_type`` and passes every check."""
    rule = rule_for(layer)
    assert type(rule) is rule_type, rule
    assert unsupported_reason(layer) is None, unsupported_reason(layer)


def assert_calls_exact(layer: nn.Module, xs: list[torch.Tensor], weights: list[float],
                       seed: int = 0) -> None:
    """Assert the rule of ``layer``, given one call per input of ``xs`` with output gradients
    scaled by ``weights`` (a method combining evaluation points, e.g. DiSK), returns the norms
    of ``d_i = sum_k w_k g_i(x_k)`` and the clipped sum ``sum_i f_i d_i`` of the float64
    one-example-at-a-time reference (the cross terms included)."""
    torch.manual_seed(seed)
    rule = rule_for(layer)
    calls, rs = [], []
    for x, w in zip(xs, weights):
        out = layer(x)
        r = torch.randn_like(out)
        rs.append(r)
        state = rule.state(layer) if rule.state is not None else None
        calls.append(Call(x, (w * r).detach(), state))
    ref_layer = copy.deepcopy(layer).double()
    params = {n: p for n, p in ref_layer.named_parameters() if p.requires_grad}
    n = xs[0].shape[0]
    per_example = []
    for i in range(n):
        loss = sum(w * (ref_layer(x[i:i + 1].double() if x.is_floating_point() else x[i:i + 1])
                        * r[i:i + 1].double()).sum() for x, r, w in zip(xs, rs, weights))
        per_example.append(dict(zip(params, torch.autograd.grad(loss, list(params.values())))))
    ref_norms = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in row.values()))
                             for row in per_example])
    reduction = max(x[0].numel() for x in xs) * len(xs)
    with torch.no_grad():
        for keep in (None, {}):
            norms = rule.norm_sq(layer, calls, keep).sqrt()
            assert_matches_reference(norms, ref_norms, dtype=torch.float32, reduction=reduction,
                                     per_row=True, name=f"{type(layer).__name__} norms")
        f = torch.rand(n) + 0.1
        sums = rule.clipped(layer, calls, f)
    own = dict(layer.named_parameters())
    for name in params:
        ref = sum(f[i].double() * per_example[i][name] for i in range(n))
        assert_matches_reference(sums[own[name]], ref, dtype=torch.float32, reduction=reduction,
                                 name=f"{type(layer).__name__} clipped sum of {name}")
