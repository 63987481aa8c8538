"""The loop: nonprivate equals plain SGD on the same batches; resume equals an unbroken run."""

from __future__ import annotations

import pytest
import torch
from opacus.data_loader import DPDataLoader

from dpbench.experiment import build_trainer
from dpbench.training.loop import Callback
from dpbench.utils.seeding import stream_generator
from tests.helpers.callbacks import Crash
from tests.helpers.config import compose_config, run_config
from tests.helpers.numerics import assert_trajectory_matches, float64_copy

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick


class _Trajectory(Callback):
    """Records the model's parameters, flattened, after every step."""

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []

    def on_step_end(self, trainer, metrics):
        self.steps.append(torch.cat([w.flatten() for w in trainer.weights]))


def test_nonprivate_equals_plain_sgd_on_the_same_batches():
    """The loop's non-private run follows plain SGD in float64 on the same batches, step by
    step, within a rounding bound that grows with the steps (tests/helpers/numerics.py)."""
    cfg = compose_config("method=nonprivate", "trainer.epochs=2", "trainer.batch_size=100",
                         "trainer.checkpoint=false")
    trajectory = _Trajectory()
    trainer = build_trainer(cfg, None, [trajectory])
    torch.manual_seed(int(cfg.seed))
    ref = float64_copy(trainer.model)
    opt = torch.optim.SGD(ref.parameters(), lr=cfg.method.optimizer.lr)
    loader = DPDataLoader(trainer.data.train, sample_rate=trainer.plan.sample_rate,
                          generator=stream_generator(int(cfg.seed), "sampler"))
    trainer.fit()
    reference = []
    for _ in range(2):
        for x, y in loader:
            opt.zero_grad()
            if len(y):
                torch.nn.functional.cross_entropy(ref(x.double()), y).backward()
            opt.step()
            reference.append(torch.cat([p.detach().flatten() for p in ref.parameters()]))
    assert len(reference) > 10
    assert_trajectory_matches(trajectory.steps, reference, dtype=torch.float32,
                              reduction=trainer.plan.expected_batch_size, name="parameters")
    assert trainer.summary()["epsilon"] == float("inf")


@pytest.mark.parametrize("method", ["dpsgd", "dpadam", "dp_ivon"])  # dp_ivon: method stream
def test_resume_after_kill_equals_uninterrupted(tmp_path, method):
    overrides = [f"method={method}", "trainer.epochs=3"]
    full = run_config(compose_config(*overrides), tmp_path / "full")
    crashed_dir = tmp_path / "crashed"
    trainer = build_trainer(compose_config(*overrides), crashed_dir, [Crash(epoch=2, after=4)])
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert trainer.step > trainer.plan.steps_per_epoch  # killed mid-epoch 2
    resumed_trainer = build_trainer(compose_config(*overrides, "trainer.resume=true"),
                                    crashed_dir)
    resumed = resumed_trainer.fit()
    assert resumed["epsilon"] == full["epsilon"]
    assert resumed["steps"] == full["steps"]
    assert resumed["privacy_ledger"] == full["privacy_ledger"]
    assert [r["epoch"] for r in resumed["history"]] == [1, 2, 3]
    assert resumed["metrics"]["accuracy"] == full["metrics"]["accuracy"]
    full_model = build_trainer(compose_config(*overrides, "trainer.resume=true"),
                               tmp_path / "full")
    full_model.maybe_resume()
    for a, b in zip(resumed_trainer.model.parameters(), full_model.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_resume_refuses_a_checkpoint_from_another_config(tmp_path):
    from dpbench.errors import ConfigError

    run_config(compose_config("trainer.epochs=1"), tmp_path)
    other = build_trainer(compose_config("trainer.epochs=1", "privacy=eps8",
                                         "trainer.resume=true"), tmp_path)
    with pytest.raises(ConfigError, match="another configuration"):
        other.fit()
