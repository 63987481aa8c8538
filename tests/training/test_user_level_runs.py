"""privacy.unit=user end to end: a run's epsilon is dp-accounting's on the event it records,
the record is re-derived by its unit, one user's records move the release by at most its
bound (ULS: C; ELS: k C for a user at the cap), the cap is applied as declared, and what is
not valid is refused in one line before any data is read."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpbench.data.users import capped_indices, user_ids
from dpbench.errors import ConfigError
from dpbench.experiment import build_trainer
from dpbench.privacy.accountant_pld import interval_for
from dpbench.privacy.ledger import from_json
from dpbench.privacy.record_check import LedgerMismatch, check_record_epsilon
from dpbench.privacy.user_level import UserLevel, els_accounting
from dpbench.training.step import clipped_aggregate
from tests.helpers.config import compose_config
from tests.helpers.method_matrix import TINY

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

#: a clip norm small enough that every user's and example's gradient is clipped
USER = (*TINY, "privacy.unit=user", "privacy.max_examples_per_user=4", "trainer.batch_size=16",
        "privacy.clip_norm=0.01")


def _dp_accounting_epsilon(record: dict, interval: float) -> float:
    """dp-accounting's PLD accountant composing the record's own event at ``interval``."""
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.privacy_accountant import NeighboringRelation

    accountant = pld_privacy_accountant.PLDAccountant(
        NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=interval)
    accountant.compose(from_json(record["mechanism"]["event"]))
    return float(accountant.get_epsilon(record["delta"]))


@pytest.fixture(scope="module", params=["uls", "els"])
def run(request):
    """A trained tiny user-level run of each strategy and its record."""
    cfg = compose_config(*USER, f"privacy.user_strategy={request.param}")
    trainer = build_trainer(cfg)
    return request.param, cfg, trainer, trainer.fit()


def test_epsilon_is_dp_accounting_on_the_recorded_event(run):
    strategy, _, _, record = run
    assert record["privacy_unit"] == "user"
    assert record["user_level"]["strategy"] == strategy
    event = from_json(record["mechanism"]["event"])
    inner = event.events[0].event  # ComposedDpEvent([SelfComposedDpEvent(step, T)])
    if strategy == "uls":
        assert type(inner).__name__ == "PoissonSampledDpEvent"
        interval = interval_for(record["steps"])
    else:
        assert type(inner).__name__ == "MixtureOfGaussiansDpEvent"
        assert list(inner.sensitivities) == [0.0, 1.0, 2.0, 3.0, 4.0]  # 0..k, k = 4
        _, interval = els_accounting([(record["noise_multiplier"], record["sample_rate"],
                                       record["steps"])], 4, record["delta"])
    assert math.isclose(record["epsilon"], _dp_accounting_epsilon(record, interval),
                        rel_tol=1e-6)
    assert record["epsilon"] <= 3.0 * (1 + 1e-9)


def test_the_record_is_re_derived_by_its_unit(run):
    strategy, _, _, record = run
    assert math.isclose(check_record_epsilon(record), record["epsilon"], rel_tol=1e-9)
    other = "els" if strategy == "uls" else "uls"
    tampered = {**record, "user_level": {**record["user_level"], "strategy": other}}
    with pytest.raises(LedgerMismatch):
        check_record_epsilon(tampered)
    as_examples = {k: v for k, v in record.items() if k not in ("privacy_unit", "user_level")}
    with pytest.raises(LedgerMismatch):  # the same ledger read per example: another epsilon
        check_record_epsilon(as_examples)


def test_a_user_over_the_cap_is_capped_as_declared(run):
    strategy, cfg, trainer, record = run
    ids = user_ids(trainer.data, cfg.dataset, int(cfg.seed))
    sizes = np.bincount(ids)
    assert (sizes > 4).any()  # the Zipf partition has users over the cap
    assert record["user_level"]["kept_examples"] == int(np.minimum(sizes, 4).sum())
    assert record["user_level"]["capped_users"] == int((sizes > 4).sum())
    kept = capped_indices(ids, 4, int(cfg.seed))
    assert np.array_equal(trainer.user.kept, kept)  # the rows data/users.py declares
    assert np.bincount(ids[kept]).max() == 4
    units = record["user_level"]["users"] if strategy == "uls" else len(kept)
    assert record["dataset_size"] == units
    assert math.isclose(record["sample_rate"], 16 / units)


def _pre_noise(trainer, rows, users=None):
    """The pre-noise sum of the run's own release path (its engine, mechanism and task) on
    training ``rows``; ``users`` (ULS): their user ids, clipped per user."""
    from torch.utils.data import default_collate

    batch = default_collate([trainer.data.train[int(i)] for i in rows])
    agg = clipped_aggregate(trainer.mechanism, trainer.engine, trainer.task, batch,
                            trainer._context(), trainer.step_plan, None, users)
    return torch.cat([s.flatten().double() for s in agg.sums])


def test_one_users_records_all_removed_move_the_release_by_its_bound(run):
    """ULS: removing every kept record of one user moves the pre-noise sum by at most C;
    ELS: by at most k C for a user at the cap (each of its k examples clipped to C)."""
    strategy, cfg, trainer, record = run
    ids = trainer.user.users.numpy()
    kept = trainer.user.kept
    capped = np.unique(ids[kept], return_counts=True)
    at_cap = capped[0][capped[1] == 4][:3]
    batch_rows = kept[np.isin(ids[kept], capped[0][:40])]
    order = np.argsort(ids[batch_rows], kind="stable")  # users contiguous, as ULS hands them
    batch_rows = batch_rows[order]
    c = record["clip_norm"]
    for user in at_cap:
        without = batch_rows[ids[batch_rows] != user]
        if strategy == "uls":
            full = _pre_noise(trainer, batch_rows, torch.as_tensor(ids[batch_rows]))
            less = _pre_noise(trainer, without, torch.as_tensor(ids[without]))
            bound = c
        else:
            full, less = _pre_noise(trainer, batch_rows), _pre_noise(trainer, without)
            bound = 4 * c
        moved = float((full - less).norm())
        assert 0 < moved <= bound * (1 + 1e-6)
    if strategy == "els":  # and the ELS event's largest sensitivity is that k (in units of C)
        inner = from_json(record["mechanism"]["event"]).events[0].event
        assert max(inner.sensitivities) == 4


def test_a_per_user_clip_broken_on_purpose_is_refused_at_the_release(monkeypatch):
    """The test-only fault (each example clipped, then summed per user: a user contributes
    up to k C) is caught by the release's sensitivity check before any noise is drawn."""
    from dpbench.errors import PrivacyError
    from dpbench.training.engine.per_user import clip_per_user

    trainer = build_trainer(compose_config(*USER, "privacy.user_strategy=uls",
                                           "trainer.grad_sample_mode=hooks"))
    engine = trainer.engine

    def broken(loss_fn, batch, users, points, factors_fn):
        return clip_per_user(engine.per_example, engine.params, loss_fn, batch, users, points,
                             factors_fn, broken_sum_after_clip=True)

    monkeypatch.setattr(engine, "clipped_user_sum", broken)
    ids = trainer.user.users.numpy()
    kept = trainer.user.kept
    rows = kept[np.isin(ids[kept], np.unique(ids[kept])[:20])]
    rows = rows[np.argsort(ids[rows], kind="stable")]
    with pytest.raises(PrivacyError, match="one user contributes"):
        _pre_noise(trainer, rows, torch.as_tensor(ids[rows]))


@pytest.mark.parametrize("overrides, key", [
    (("method=dpadam",), "method=dpadam"),
    (("privacy.user_strategy=els", "privacy.accountant=rdp"), "privacy.accountant=rdp"),
    (("trainer.sampler=shuffle",), "trainer.sampler=shuffle"),
])
def test_what_has_no_valid_user_level_run_is_refused_in_one_line(overrides, key):
    with pytest.raises(ConfigError) as err:
        build_trainer(compose_config(*USER, *overrides))
    assert key in str(err.value) and "\n" not in str(err.value)


def test_user_level_accountant_state_is_the_runs(run):
    strategy, _, trainer, _ = run
    assert trainer.accountant.user == UserLevel(strategy, 4)


def test_the_report_and_the_unit_table_read_the_unit_from_the_record(run, tmp_path):
    """The run's record, as the job writes it, is tabulated under its own unit."""
    import json

    from dpbench.analysis.results import load_frame
    from dpbench.analysis.tables import cell_table
    from dpbench.analysis.unit_comparison import unit_table

    strategy, _, _, record = run
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(
        {**record, "status": "completed", "dataset": "digits", "model": "mlp",
         "method": "dpsgd", "method_name": "dpsgd", "seed": 0}, default=str))
    label = f"user ({strategy}, k=4)"
    table = cell_table(load_frame(tmp_path), "accuracy")
    assert list(table.index.names)[-1] == "unit" and table.index[0][-1] == label
    row = unit_table([tmp_path]).iloc[0]
    assert row["unit"] == label and row["eps"] == "3"
    assert row["accuracy"] == f"{record['metrics']['accuracy']:.4f} (n=1)"
    assert row["steps"] == record["steps"] and row["users"] == record["user_level"]["users"]


@pytest.fixture(scope="module")
def uls_runs():
    """The same ULS run (seed 0) under each engine: {mode: (trainer, record)}."""
    out = {}
    for mode in ("hooks", "bk", "ghost"):
        trainer = build_trainer(compose_config(*USER, "privacy.user_strategy=uls",
                                               f"trainer.grad_sample_mode={mode}"))
        out[mode] = trainer, trainer.fit()
    return out


@pytest.mark.parametrize("mode", ["bk", "ghost"])
def test_bk_and_ghost_train_per_user_as_hooks_does(uls_runs, mode):
    """bk and ghost clip per user end to end: the engine checked (per-user path included),
    the same epsilon as the hooks run, and the same parameters on a fixed seed (the engines
    differ by float32 rounding only; every user is clipped at C = 0.01)."""
    hooks, (trainer, record) = uls_runs["hooks"], uls_runs[mode]
    assert record["grad_sample_mode"] == mode and record["engine_check"]["engine"] == mode
    assert trainer.engine.per_user
    assert record["epsilon"] == hooks[1]["epsilon"]
    assert record["steps"] == hooks[1]["steps"]
    tol = 1024 * torch.finfo(torch.float32).eps
    for a, b in zip(trainer.model.parameters(), hooks[0].model.parameters()):
        assert float((a - b).detach().norm()) <= tol * max(float(b.detach().norm()), 1.0)
