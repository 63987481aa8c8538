"""The per-run check: every private run's engine is compared with plain autograd before the
first release (and after a resume); a wrong engine is refused, ``auto`` falls back, the check
is recorded and leaves the run's results unchanged.

``dpbench.training.engine_check`` is imported inside the tests that use it directly, so the
others also run (and fail) against code without the check."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dpbench.errors import ConfigError
from dpbench.experiment import build_trainer
from dpbench.training import step
from dpbench.training.engine import choice as engines
from dpbench.training.engine.materialised import clip_materialised
from dpbench.training.engine.protocol import ClippedSum
from dpbench.training.engine.rules.linear import LinearRule
from tests.helpers.config import compose_config
from tests.helpers.method_matrix import TINY

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick


def _cfg(*overrides: str):
    return compose_config(*TINY, "privacy=sigma", "privacy.noise_multiplier=1.0", *overrides)


class BrokenNorms:
    """An engine whose norms are off by 2x (per-example gradients of one parameter doubled)."""

    def __init__(self, engine) -> None:
        self.engine, self.mode, self.materialises = engine, engine.mode, engine.materialises
        self.params, self.names, self.module = engine.params, engine.names, engine.module

    def per_example(self, loss_fn, batch):
        grads, losses = self.engine.per_example(loss_fn, batch)
        return [2 * grads[0], *grads[1:]], losses

    def clipped_sum(self, loss_fn, batch, points, factors_fn, observe=None):
        if self.materialises:  # the doubled per-example gradients, through the loop's path
            return clip_materialised(self.per_example, self.params, self.names, loss_fn, batch,
                                     points, factors_fn, observe)
        sums, norms, factors, losses, kept = self.engine.clipped_sum(
            loss_fn, batch, points, lambda n: factors_fn(2 * n))
        return ClippedSum(sums, 2 * norms, factors, losses, kept)

    def close(self) -> None:
        self.engine.close()


@pytest.fixture
def releases(monkeypatch):
    """Count the loop's releases (each draws the step's noise)."""
    calls = []
    real = step.private_release

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("dpbench.training.loop.private_release", counted)
    return calls


def _broken_linear_rule(monkeypatch) -> None:
    """Book-keeping's Linear norm rule off by 2x (its squared norm times 4)."""
    real = LinearRule.norm_sq
    monkeypatch.setattr(LinearRule, "norm_sq", lambda *a, **k: 4 * real(*a, **k))


def test_a_norm_rule_off_by_2x_is_refused_before_any_noise(monkeypatch, releases):
    _broken_linear_rule(monkeypatch)
    with pytest.raises(ConfigError) as err:
        build_trainer(_cfg("trainer.grad_sample_mode=bk"), None).fit()
    message = str(err.value)
    assert "\n" not in message and "engine bk" in message and "weight" in message
    assert releases == []


def test_auto_falls_back_when_bk_is_wrong(monkeypatch, releases):
    _broken_linear_rule(monkeypatch)
    trainer = build_trainer(_cfg(), None)
    assert trainer.grad_sample_mode == "hooks"
    assert [r["engine"] for r in trainer.engine_rejected] == ["bk"]
    assert "disagrees with plain autograd" in trainer.engine_rejected[0]["reason"]
    summary = trainer.fit()
    assert summary["engine_check"]["rejected"][0]["engine"] == "bk"
    assert len(releases) == summary["steps"] > 0


@pytest.mark.parametrize("mode", ["bk", "hooks", "functorch", "ghost"])
def test_every_engine_is_checked(monkeypatch, releases, mode):
    real = engines.build_engine
    monkeypatch.setattr(engines, "build_engine", lambda model, m: BrokenNorms(real(model, m)))
    with pytest.raises(ConfigError, match=f"grad_sample_mode={mode} is not exact.*engine {mode}"):
        build_trainer(_cfg(f"trainer.grad_sample_mode={mode}"), None)
    with pytest.raises(ConfigError, match="no per-example engine is exact"):
        build_trainer(_cfg(), None)  # auto: every candidate is broken, so none runs
    assert releases == []


def test_the_check_is_recorded_with_its_worst_error():
    summary = build_trainer(_cfg(), None).fit()
    record = summary["engine_check"]
    assert record["engine"] == summary["grad_sample_mode"] == "bk"
    assert [c["when"] for c in record["checks"]] == ["start"]
    assert record["examples"] == 4 and record["checks"][0]["seconds"] > 0
    worst = summary["unprivatised_diagnostics"]["engine_check"][0]["worst_error"]
    assert 0 <= worst <= record["tolerance"] == 2048 * torch.finfo(torch.float32).eps
    assert "worst_error" not in str(record)  # data-derived values stay un-published


def test_the_check_leaves_the_run_unchanged(monkeypatch):
    """The check draws from no run stream: a run with it equals a run without it."""
    from dpbench.training.engine.check import EngineCheck, EngineVerifier
    cfg = _cfg("trainer.epochs=2")
    with_check = build_trainer(cfg, None)
    states = {k: g.get_state() for k, g in with_check.generators.items()}
    first = with_check.fit()
    monkeypatch.setattr(EngineVerifier, "prepare", lambda self, engine=None: None)
    monkeypatch.setattr(EngineVerifier, "check", lambda self, engine: EngineCheck(
        engine=engine.mode, examples=0, tolerance=1.0))
    without = build_trainer(cfg, None)
    assert all(torch.equal(states[k], g.get_state()) for k, g in without.generators.items())
    second = without.fit()
    for a, b in zip(with_check.params, without.params):
        assert torch.equal(a, b)
    # NaN-aware (a reliability bin may be empty): the same text
    assert json.dumps(first["history"]) == json.dumps(second["history"])
    assert first["epsilon"] == second["epsilon"]


def test_a_resumed_run_is_checked_again(tmp_path):
    run_dir, cfg = tmp_path / "run", _cfg("trainer.checkpoint=true", "trainer.resume=true")
    first = build_trainer(cfg, run_dir).fit()
    resumed = build_trainer(cfg, run_dir)  # its checkpoint is at the end: nothing left to run
    summary = resumed.fit()
    assert [c["when"] for c in summary["engine_check"]["checks"]] == ["start", "resume"]
    assert summary["engine_check"]["checks"][1]["step"] == first["steps"] > 0
    broken = build_trainer(cfg, run_dir)
    broken.engine = BrokenNorms(broken.engine)  # wrong only after the start check
    with pytest.raises(ConfigError, match=r"engine check failed \(resume\)"):
        broken.fit()


def test_examples_with_non_finite_losses_are_skipped_by_the_check():
    from dpbench.training.engine.check import SCAN_ROWS, EngineVerifier, check_rows
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    x = torch.randn(12, 3)
    x[:5, 0] = math.nan  # rows 0-4: a NaN loss (and 0 * NaN in a batched backward)

    def loss(m, batch):
        return m(batch[0]).squeeze(1)

    engine = engines.build_engine(model, "bk")
    check = EngineVerifier(model, loss, TensorDataset(x), torch.device("cpu")).check(engine)
    assert check.passed and check.examples == 4
    assert bool(torch.isfinite(check_rows(TensorDataset(x), torch.device("cpu"),
                                          range(5, 9))[0]).all())
    nan = torch.full((SCAN_ROWS + 4, 3), math.nan)
    with pytest.raises(ConfigError, match="no example with a finite loss"):
        EngineVerifier(model, loss, TensorDataset(nan), torch.device("cpu")).check(engine)


def test_multi_point_methods_and_virtual_batches_are_checked():
    for mode in ("auto", "bk", "hooks"):  # the two-point path of each engine is checked too
        disk = build_trainer(_cfg("method=disk", f"trainer.grad_sample_mode={mode}"), None)
        expected = "hooks" if mode == "hooks" else "bk"
        assert disk.grad_sample_mode == expected and disk.engine_checks[0]["engine"] == expected
        assert disk.engine.combines_points
    chunked = build_trainer(_cfg("trainer.max_physical_batch_size=2"), None)
    assert chunked.engine_checks and chunked.engine_checks[0]["examples"] == 4


def test_the_audit_and_a_cached_prefix_run_the_check():
    from hydra import compose, initialize_config_dir

    from dpbench.audit.cli import run_audit
    from dpbench.training.prefix_cache import PrefixCachedModel
    from dpbench.utils.conf import CONF_DIR
    from tests.helpers.cli import QUIET_CLI
    from tests.helpers.method_matrix import method_overrides
    from tests.helpers.text_runs import minilm_run as _cached_run

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("audit", overrides=[*QUIET_CLI, *method_overrides("dpsgd"),
                                          "audit.canaries=200", "audit.guesses_included=20",
                                          "audit.guesses_excluded=20"])
    record = run_audit(cfg)  # the audit's trainer subclasses the loop: checked likewise
    assert record["engine_check"]["engine"] == "hooks"
    assert [c["when"] for c in record["engine_check"]["checks"]] == ["start"]
    cached, summary = _cached_run("on", "bk")  # checked on the cached features it trains on
    assert isinstance(cached.model, PrefixCachedModel)
    assert summary["engine_check"]["engine"] == summary["grad_sample_mode"] == "bk"
