"""One neighbouring relation per figure: bounds under the relation they hold for, the
recorded convention read only by the accountant/relation pairs it names, compositions under
one relation, and record re-derivation that reads nothing it can recompute."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
from dp_accounting import dp_event as ev
from dp_accounting import privacy_accountant as pa
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize, special

from dpbench.errors import ConfigError
from dpbench.privacy.accountant import PrivacyAccountant
from dpbench.privacy.composition import compose_ledgers, composed_relation
from dpbench.privacy.fixed_size_bound import fixed_size_lower_bound
from dpbench.privacy.gap import epsilon_if_poisson, lower_bound
from dpbench.privacy.record_check import LedgerMismatch, check_record_epsilon
from dpbench.privacy.samplers import (
    ADD_REMOVE,
    DP_ACCOUNTING_RELATION,
    REPLACE_ONE,
    ZERO_OUT,
    Sampling,
    convention,
    steps_per_epoch,
)
from dpbench.privacy.shuffle_bound import left_out_fraction, shuffle_lower_bound
from dpbench.privacy.verify import dp_accounting_epsilon, event_epsilon

DELTA = 1e-5
N, B = 1438, 128  # digits at the docs' batch size: T = 11, 30 examples left out an epoch
Q = B / N


def _accounted(sampling: Sampling, accountant: str, sigma: float, steps: int) -> float:
    acc = PrivacyAccountant(accountant, sampling)
    acc.step(sigma, sampling.batch_size / sampling.dataset_size, steps)
    return acc.get_epsilon(DELTA)


def _pld(event, relation, delta: float = DELTA) -> float:
    acc = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=pa.NeighboringRelation[relation], value_discretization_interval=1e-4)
    acc.compose(event)
    return acc.get_epsilon(delta)


# ---- the shuffle lower bound with examples left out -------------------------------------------
def _exact_max_epsilon(s: float, t: int, w: float, delta: float) -> float:
    """Epsilon at ``delta`` of one shuffled epoch's largest noisy sum, by its closed form in
    float64 (no bins, no PLD): the pair ((1 - w) P + w Q, Q) with P(M <= c) =
    Phi((c - 1)/s) Phi(c/s)^(T-1), Q(M <= c) = Phi(c/s)^T. Its likelihood ratio
    (1 - w) L(c) + w, L(c) = (phi((c-1)/s)/phi(c/s) + (T-1) Phi((c-1)/s)/Phi(c/s)) / T, rises
    in c, so the hockey-stick divergence is the tail mass beyond the c* where it equals
    e^eps."""
    def log_ratio(c: float) -> float:
        first = ((2 * c - 1) / (2 * s * s))  # log phi((c-1)/s) - log phi(c/s)
        second = special.log_ndtr((c - 1) / s) - special.log_ndtr(c / s)
        lr = special.logsumexp([first, math.log(t - 1) + second]) - math.log(t) if t > 1 \
            else first
        return float(special.logsumexp([math.log1p(-w) + lr, math.log(w)])) if w > 0 else lr

    def surv(c: float, shift: float) -> float:  # P(M > c) under P (shift 1) or Q (shift 0)
        return -math.expm1(special.log_ndtr((c - shift) / s) + (t - 1) * special.log_ndtr(c / s))

    def hockey(eps: float) -> float:
        c = optimize.brentq(lambda x: log_ratio(x) - eps, -50 * s, 50 * s + 50, xtol=1e-13)
        q_tail = surv(c, 0.0)
        p_tail = (1 - w) * surv(c, 1.0) + w * q_tail
        return p_tail - math.exp(eps) * q_tail

    return optimize.brentq(lambda e: hockey(e) - delta, 1e-6, 60.0, xtol=1e-10)


@pytest.mark.parametrize("sigma,n,batch", [(1.0, N, B), (2.0, 50, 8), (0.8, 200, 30)])
def test_shuffle_lower_bound_mixes_in_the_left_out_examples(sigma, n, batch):
    """B does not divide N: each epoch leaves (N - T B) / N of the examples out; the bound
    for one epoch equals the independent closed form of the mixture (from below, within
    the binning's 2 %), and stays below the bound that ignores them."""
    t = steps_per_epoch(n, batch)
    w = left_out_fraction(n, batch, t)
    assert t * batch < n and w == (n - t * batch) / n
    s = sigma / 2  # replace-one
    exact = _exact_max_epsilon(s, t, w, DELTA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mixed = shuffle_lower_bound(s, t, 1, DELTA, left_out=w)
        unmixed = shuffle_lower_bound(s, t, 1, DELTA)
    assert 0.98 * exact <= mixed <= exact * (1 + 1e-9)
    assert mixed < unmixed <= _exact_max_epsilon(s, t, 0.0, DELTA) * (1 + 1e-9)


def test_the_run_lower_bound_uses_the_left_out_fraction():
    """The docs' shuffled run (sigma 1, 10 epochs, N = 1438, B = 128): 24.73 under
    replace-one, not the 25.07 of an epoch with no example left out; 5.14 under zero-out."""
    history = [(1.0, Q, 110)]
    replace = lower_bound(Sampling("shuffle", REPLACE_ONE, N, B, 11), history, DELTA)
    zero = lower_bound(Sampling("shuffle", ZERO_OUT, N, B, 11), history, DELTA)
    assert replace == pytest.approx(24.73, abs=0.01)
    assert shuffle_lower_bound(0.5, 11, 10, DELTA) == pytest.approx(25.07, abs=0.01)
    assert zero == pytest.approx(5.14, abs=0.01) and zero < 6.55  # below Poisson's 6.54


# ---- fixed_size lower bound -----------------------------------------------------------------
def test_fixed_size_lower_bound_lies_between_the_poisson_figure_and_the_rdp_bound():
    sampling = Sampling("fixed_size", REPLACE_ONE, N, B, 11)
    history = [(1.0, Q, 110)]
    low = lower_bound(sampling, history, DELTA)
    valid = _accounted(sampling, "rdp", 1.0, 110)
    as_poisson = epsilon_if_poisson("rdp", history, DELTA)
    assert as_poisson < low < valid
    assert low == pytest.approx(29.83, abs=0.02) and valid == pytest.approx(78.70, abs=0.01)
    # the constructive pair is the Poisson-subsampled Gaussian at sigma/2: the optimistic
    # bound sits just below dp-accounting's pessimistic PLD of that pair
    pessimistic = _pld(ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(Q, ev.GaussianDpEvent(
        0.5)), 110), "ADD_OR_REMOVE_ONE")
    assert 0.99 * pessimistic <= low <= pessimistic
    assert fixed_size_lower_bound([(5.97, Q, 110)], 2.0, DELTA) == pytest.approx(1.24, abs=0.01)


# ---- Poisson under replace-one ---------------------------------------------------------------
def test_poisson_under_replace_one_is_dp_accountings_pld_under_replace_one():
    sampling = Sampling("poisson", REPLACE_ONE, N, B, 11)
    got = _accounted(sampling, "pld", 1.0, 110)
    direct = _pld(ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(Q, ev.GaussianDpEvent(1.0)),
                                         110), "REPLACE_ONE")
    assert got == pytest.approx(direct, rel=5e-3) and got == pytest.approx(9.73, abs=0.01)
    assert got >= direct * (1 - 1e-3)  # dpbench's grid is the coarser, pessimistic one
    # zero-out: the same privacy loss as add/remove for Poisson batches
    assert _accounted(Sampling("poisson", ZERO_OUT, N, B, 11), "pld", 1.0, 110) == \
        _accounted(Sampling("poisson", ADD_REMOVE, N, B, 11), "pld", 1.0, 110)


# ---- composing runs under different relations ------------------------------------------------
def _ledger(sampling: Sampling, sigma: float, steps: int) -> list[dict]:
    from dpbench.privacy.ledger import PrivacyLedger, Query

    led = PrivacyLedger()
    for _ in range(steps):
        led.record(Q, [Query("gradient", 1.0, sigma)], sampling.ledger_spec())
    return led.to_json()


def test_mixed_relations_compose_under_replace_one():
    """A Poisson (add/remove) run then a shuffled (replace-one) one: 49.13 under
    replace-one, as dp-accounting's PLD gives for both events under REPLACE_ONE; reading both
    as one relation gave 47.38, an under-report."""
    poisson = _ledger(Sampling("poisson", ADD_REMOVE, N, B, 11), 1.0, 110)
    shuffled = _ledger(Sampling("shuffle", REPLACE_ONE, N, B, 11), 1.0, 110)
    got = compose_ledgers([poisson, shuffled], DELTA, "pld")
    direct = _pld(ev.ComposedDpEvent([
        ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(Q, ev.GaussianDpEvent(1.0)), 110),
        ev.SelfComposedDpEvent(ev.GaussianDpEvent(1.0), 10)]), "REPLACE_ONE")
    assert composed_relation([poisson, shuffled]) == REPLACE_ONE
    assert got == pytest.approx(direct, rel=5e-3) and got == pytest.approx(49.13, abs=0.02)
    naive = _pld(ev.ComposedDpEvent([
        ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(Q, ev.GaussianDpEvent(1.0)), 110),
        ev.SelfComposedDpEvent(ev.GaussianDpEvent(0.5), 10)]), "ADD_OR_REMOVE_ONE")
    assert naive == pytest.approx(47.38, abs=0.02) and got > naive
    # one relation: unchanged (two Poisson runs under add/remove)
    assert composed_relation([poisson, poisson]) == ADD_REMOVE
    with pytest.raises(ConfigError, match="^privacy.accountant=rdp cannot compose") as err:
        compose_ledgers([poisson, shuffled], DELTA, "rdp")
    assert "\n" not in str(err.value)


def test_tuned_cells_are_keyed_by_sampler_and_relation():
    from dpbench.tune.choices import cfg_cell_key
    from tests.helpers.config import compose_config

    poisson = cfg_cell_key(compose_config("method=dpsgd"))
    explicit = cfg_cell_key(compose_config("method=dpsgd", "privacy.accountant=pld"))
    shuffle = cfg_cell_key(compose_config("method=dpsgd", "trainer.sampler=shuffle"))
    zero = cfg_cell_key(compose_config("method=dpsgd", "trainer.sampler=shuffle",
                                       "privacy.neighbouring=zero_out"))
    same = cfg_cell_key(compose_config("method=dpsgd", "trainer.sampler=shuffle",
                                       "privacy.neighbouring=replace_one"))
    assert poisson == explicit and "sampler=" not in poisson  # earlier choices still match
    assert "|sampler=shuffle|neighbouring=replace_one|" in shuffle
    assert "|sampler=shuffle|neighbouring=zero_out|" in zero
    assert len({poisson, shuffle, zero}) == 3
    assert same.rpartition("|run=")[0] == shuffle.rpartition("|run=")[0]


# ---- the recorded convention, read by each supporting dp-accounting accountant ----------------
RUNS = [("poisson", ADD_REMOVE, "pld"), ("poisson", ADD_REMOVE, "rdp"),
        ("poisson", REPLACE_ONE, "pld"), ("poisson", ZERO_OUT, "rdp"),
        ("fixed_size", REPLACE_ONE, "rdp"), ("shuffle", REPLACE_ONE, "pld"),
        ("shuffle", REPLACE_ONE, "rdp"), ("shuffle", ZERO_OUT, "pld")]
#: Opacus's RDP (dpbench's rdp for Poisson) and dp-accounting's differ in their orders
RTOL = {"pld": 5e-3, "rdp": 2e-2}


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict:
    from tests.helpers.config import compose_config, run_config

    out = {}
    for sampler, relation, accountant in RUNS:
        out[(sampler, relation, accountant)] = run_config(compose_config(
            "method=dpsgd", f"trainer.sampler={sampler}", f"privacy.neighbouring={relation}",
            f"privacy.accountant={accountant}", "trainer.epochs=2", "trainer.checkpoint=false"),
            tmp_path_factory.mktemp(f"{sampler}_{relation}_{accountant}"))
    return out


@pytest.mark.parametrize("run", RUNS, ids=["-".join(r) for r in RUNS])
def test_every_samplers_record_is_re_derived_by_each_supporting_accountant(records, run):
    summary = records[run]
    sampler, relation, accountant = run
    mechanism = summary["mechanism"]
    conv = mechanism["convention"]
    assert conv == convention(Sampling(sampler, relation)) and conv["neighbouring"] == relation
    assert summary["neighbouring"] == relation and summary["accountant"] == accountant
    assert check_record_epsilon(summary) == pytest.approx(summary["epsilon"], rel=1e-12)
    assert event_epsilon(mechanism["event"], summary["delta"], accountant, conv) == \
        pytest.approx(summary["epsilon"], rel=1e-9)
    readers = {(p["accountant"], p["neighboring_relation"]) for p in conv["read_by"]}
    assert any(a == accountant for a, _ in readers)
    for reader in ("pld", "rdp"):
        for name in DP_ACCOUNTING_RELATION.values():
            if (reader, name) in readers:
                got = dp_accounting_epsilon(mechanism["event"], summary["delta"], conv, reader,
                                            name)
                if reader == accountant:  # the reported figure, by dp-accounting itself
                    assert got == pytest.approx(summary["epsilon"], rel=RTOL[reader])
                elif reader == "rdp":  # RDP bounds the same mechanism more loosely
                    assert got >= summary["epsilon"] * (1 - RTOL[accountant])
                else:  # PLD, tighter than the RDP figure the run reported
                    assert 0 < got <= summary["epsilon"] * (1 + RTOL[accountant])
            else:  # a pair that would double-count or halve the factor 2 is refused
                with pytest.raises(ValueError, match="^mechanism.convention"):
                    dp_accounting_epsilon(mechanism["event"], summary["delta"], conv, reader,
                                          name)


def test_a_shuffled_record_read_by_pld_under_replace_one_would_double_count(records):
    """The ambiguity the convention removes: dp-accounting's PLD under REPLACE_ONE doubles
    the sensitivity of events already relative to 2C (a far larger figure); refused."""
    summary = records[("shuffle", REPLACE_ONE, "pld")]
    event, delta = summary["mechanism"]["event"], summary["delta"]
    from dpbench.privacy.ledger import from_json

    assert _pld(from_json(event), "REPLACE_ONE", delta) > 2 * summary["epsilon"]
    with pytest.raises(ValueError, match="REPLACE_ONE"):
        dp_accounting_epsilon(event, delta, summary["mechanism"]["convention"], "pld",
                              "REPLACE_ONE")


def test_the_record_check_refuses_a_mismatched_convention(records):
    summary = copy.deepcopy(records[("shuffle", REPLACE_ONE, "pld")])
    summary["mechanism"]["convention"] = convention(Sampling("poisson", REPLACE_ONE))
    with pytest.raises(LedgerMismatch, match="mechanism.convention") as err:
        check_record_epsilon(summary, "results.json")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError):  # and event_epsilon will not read the event that way
        event_epsilon(summary["mechanism"]["event"], summary["delta"], "pld",
                      {"neighbouring": ZERO_OUT, "multiplier_relative_to": "2C"})


def test_a_forged_steps_per_epoch_is_refused(records):
    """A shuffled record whose ledger claims 1,650 steps per epoch where its own N and B
    give 11 (far fewer epochs, so far less epsilon), the stated epsilon edited to match, is
    refused in one line naming the file and the key."""
    from dpbench.privacy.record_check import ledger_epsilon

    summary = copy.deepcopy(records[("shuffle", REPLACE_ONE, "pld")])
    spec = summary["privacy_ledger"][0]["sampling"]
    honest = spec["steps_per_epoch"]
    assert honest == steps_per_epoch(spec["dataset_size"], spec["batch_size"])
    for entry in summary["privacy_ledger"]:
        entry["sampling"]["steps_per_epoch"] = 1650
    summary["epsilon"] = ledger_epsilon(summary["privacy_ledger"], summary["delta"])
    summary.pop("mechanism")  # a forger drops what would give it away
    with pytest.raises(LedgerMismatch) as err:
        check_record_epsilon(summary, "runs/x/results.json")
    message = str(err.value)
    assert message.startswith("runs/x/results.json: privacy_ledger[0].sampling.steps_per_epoch")
    assert "1650" in message and f"give {honest}" in message and "\n" not in message


def test_fixed_size_without_an_accountant_chooses_rdp_and_says_so(tmp_path):
    from tests.helpers.config import compose_config, run_config

    summary = run_config(compose_config("method=dpsgd", "trainer.sampler=fixed_size",
                                        "trainer.epochs=1", "trainer.checkpoint=false"),
                         tmp_path)
    assert summary["accountant"] == "rdp"
    assert "chose rdp" in summary["accountant_note"] and "fixed_size" in summary[
        "accountant_note"]
    assert summary["epsilon_lower_bound"] < summary["epsilon"]
    assert summary["epsilon_lower_bound_neighbouring"] == REPLACE_ONE
    with pytest.raises(ConfigError, match="^privacy.accountant=pld"):
        run_config(compose_config("method=dpsgd", "trainer.sampler=fixed_size",
                                  "privacy.accountant=pld"), tmp_path / "refused")


def test_rdp_reads_a_shuffle_epoch_the_same_under_each_relation_it_is_listed_for():
    """The convention lists RDP under add/remove and replace-one for shuffle's Gaussians
    relative to 2C: dp-accounting's RDP does not rescale a plain Gaussian by relation."""
    values = []
    for name in ("ADD_OR_REMOVE_ONE", "REPLACE_ONE"):
        acc = rdp_privacy_accountant.RdpAccountant(
            neighboring_relation=pa.NeighboringRelation[name])
        acc.compose(ev.GaussianDpEvent(0.5), 10)
        values.append(acc.get_epsilon(DELTA))
    assert values[0] == pytest.approx(values[1], rel=1e-12)


def test_privacy_modules_import_from_modules_not_their_own_package():
    """No import circle through ``dpbench/privacy/__init__.py``: its modules import each
    other by module (``from dpbench.privacy.calibration import ...``), never the package."""
    import ast
    from pathlib import Path

    import dpbench.privacy

    folder = Path(dpbench.privacy.__file__).parent
    offenders = []
    for path in sorted(folder.glob("*.py")):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "dpbench.privacy":
                offenders.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Import) and any(a.name == "dpbench.privacy"
                                                    for a in node.names):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_the_report_puts_each_relation_in_its_own_column():
    import pandas as pd

    from dpbench.analysis.results import row_eps_label
    from dpbench.analysis.tables import _eps_order

    rows = [{"private": True, "target_epsilon": 3.0, "neighbouring": n, "noise_multiplier": 1.5}
            for n in ("replace_one", "add_remove", "zero_out")]
    labels = [row_eps_label(pd.Series(r)) for r in rows]
    assert labels == ["eps=3 (replace-one)", "eps=3", "eps=3 (zero-out)"]
    assert _eps_order([*labels, "eps=1", "sigma=1", "eps=n/a"]) == [
        "eps=1", "eps=3", "eps=3 (replace-one)", "eps=3 (zero-out)", "sigma=1", "eps=n/a"]


@pytest.mark.parametrize("relation", [REPLACE_ONE, ZERO_OUT])
def test_cyclic_poisson_is_refused_under_another_relation_than_add_remove(relation):
    from types import SimpleNamespace

    from dpbench.privacy.plan import plan_privacy

    privacy = SimpleNamespace(enabled=True, delta=None, noise_multiplier=1.0,
                              target_epsilon=None, accountant=None, neighbouring=relation)
    trainer = SimpleNamespace(batch_size=100, epochs=2, sampler="poisson")
    with pytest.raises(ConfigError, match=f"^privacy.neighbouring={relation}: this method"):
        plan_privacy(privacy, trainer, 1000, True, bands=2)
    plan = plan_privacy(privacy, trainer, 1000, True)  # plain Poisson: offered
    assert plan.accountant == "pld" and plan.sampling.neighbouring == relation
    assert "chose pld" in plan.accountant_note


@pytest.mark.integration
def test_dpbench_with_fixed_size_alone_chooses_rdp_and_says_so_from_a_fresh_shell(tmp_path):
    """The console script as a user runs it, from outside the repository: the first lines
    name the chosen accountant, the per-epoch and final lines the relation."""
    import json

    from tests.test_console_scripts import QUIET, _run

    run = tmp_path / "run"
    done = _run("dpbench", [*QUIET, "trainer.sampler=fixed_size", f"hydra.run.dir={run}"],
                tmp_path)
    text = done.stdout + done.stderr
    assert "privacy.accountant=null: chose rdp, the accountant for trainer.sampler=fixed_size" \
        in text
    assert "accountant=rdp sampler=fixed_size neighbouring=replace_one" in text
    assert "delta 1e-05, replace-one), test accuracy" in text
    record = json.loads((run / "results.json").read_text())
    assert record["accountant"] == "rdp" and record["neighbouring"] == REPLACE_ONE
