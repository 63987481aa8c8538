"""The membership scores and their metrics against the published formulas on fixed inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score, roc_curve

from dpbench.audit.mia import metrics as mia_metrics
from dpbench.audit.mia.attacks import (
    RMIA_A_GRID,
    UndefinedScore,
    augmented,
    choose_rmia_a,
    gaussian_fit,
    lira_offline,
    lira_online,
    logit_confidence,
    loss_score,
    rmia,
    rmia_log_reference_probability,
)
from dpbench.audit.mia.metrics import (
    FPR_POINTS,
    attack_metrics,
    balanced_accuracy,
    bootstrap_intervals,
    clopper_pearson,
    clopper_pearson_bounds,
    empirical_epsilon,
    epsilon_from_rates,
    members_first_auc,
    point_metrics,
    roc,
    tpr_at_fpr,
)
from dpbench.audit.mia.models import ModelOutputs
from dpbench.audit.mia.scoring import score_attacks
from dpbench.audit.mia.settings import MIASettings
from dpbench.audit.mia.split import memberships, model_seed
from dpbench.errors import TrainingDiverged

TOL = 1e-10


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def test_logit_confidence_is_log_odds_of_the_true_label():
    rng = np.random.default_rng(0)
    lp, y = _log_softmax(rng.normal(size=(20, 5))), rng.integers(0, 5, 20)
    p = np.exp(lp[np.arange(20), y])
    np.testing.assert_allclose(logit_confidence(lp, y), np.log(p / (1 - p)), rtol=1e-9)
    # stable where 1 - p rounds to 0 in float64: phi = 40 exactly for logits (40, 0)
    lp = _log_softmax(np.array([[40.0, 0.0]]))
    assert logit_confidence(lp, np.array([0])) == pytest.approx(40.0, abs=1e-9)


def test_loss_score_is_minus_cross_entropy():
    lp = np.log(np.array([0.9, 0.2, 0.5]))
    cross_entropy = -lp
    np.testing.assert_allclose(loss_score(lp), -cross_entropy)


def test_gaussian_fit_hand_computed():
    values = np.array([[1.0, 5.0], [3.0, 7.0], [0.0, 9.0]])
    mask = np.array([[True, True], [True, True], [False, True]])
    mean, sd = gaussian_fit(values, mask)
    np.testing.assert_allclose(mean, [2.0, 7.0])
    # deviations: example 0: -1, 1 (dof 1); example 1: -2, 0, 2 (dof 2): (2 + 8) / 3
    assert sd == pytest.approx(math.sqrt(10 / 3), abs=TOL)
    with pytest.raises(ValueError):
        gaussian_fit(values[:1], mask[:1])
    # per example: example 0 has sd sqrt(2), example 1 sd 2; a lone value takes the pooled
    _, own = gaussian_fit(values, mask, per_example=True)
    np.testing.assert_allclose(own, [math.sqrt(2), 2.0], rtol=1e-12)
    _, own = gaussian_fit(values, np.array([[True, True], [True, True], [False, False]]),
                          per_example=True)
    assert own[1] == pytest.approx(math.sqrt(((3 - 2) ** 2 + (1 - 2) ** 2 + (5 - 6) ** 2
                                              + (7 - 6) ** 2) / 2))


def test_lira_online_and_offline_equal_the_gaussian_formulas():
    # 4 references, 3 examples; every example has two IN and two OUT values
    refs = np.array([[2.0, 1.0, 0.0], [4.0, 3.0, 1.0], [0.0, -1.0, -2.0], [-2.0, 1.0, -4.0]])
    in_refs = np.array([[1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0]], bool)
    phi = np.array([3.0, 0.0, -1.0])
    mu_in, mu_out = refs[:2].mean(0), refs[2:].mean(0)
    sd_in = math.sqrt(((refs[:2] - mu_in) ** 2).sum() / 3)
    sd_out = math.sqrt(((refs[2:] - mu_out) ** 2).sum() / 3)
    want_online = (stats.norm.logpdf(phi, mu_in, sd_in) - stats.norm.logpdf(phi, mu_out, sd_out))
    np.testing.assert_allclose(lira_online(phi, refs, in_refs), want_online, rtol=1e-12)
    # offline: Lambda = 1 - Pr[Z > phi], compared by its -log(1 - Lambda) form
    want_offline = 1 - stats.norm.sf(phi, mu_out, sd_out)
    got = 1 - np.exp(-lira_offline(phi, refs, in_refs))
    np.testing.assert_allclose(got, want_offline, rtol=1e-12)


def test_lira_fills_a_missing_side_with_the_average_gap():
    refs = np.array([[2.0, 1.0, 5.0], [4.0, 3.0, 7.0], [0.0, -1.0, 6.0], [1.0, 0.0, 4.0]])
    in_refs = np.array([[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]], bool)  # 2: no OUT
    mu_in, mu_out = refs[:2, :2].mean(0), refs[2:, :2].mean(0)
    gap = float(np.mean(mu_in - mu_out))
    sd_out = math.sqrt(((refs[2:, :2] - mu_out) ** 2).sum() / 2)
    got = lira_offline(np.array([0.0, 0.0, 6.0]), refs, in_refs)
    assert got[2] == pytest.approx(-stats.norm.logsf(6.0, refs[:, 2].mean() - gap, sd_out),
                                   rel=1e-12)


def test_rmia_equals_the_pairwise_likelihood_ratio_count():
    rng = np.random.default_rng(1)
    n, m, refs = 40, 25, 3
    p_x, p_z = rng.uniform(0.01, 1, n), rng.uniform(0.01, 1, m)
    refs_x, refs_z = rng.uniform(0.01, 1, (refs, n)), rng.uniform(0.01, 1, (refs, m))
    in_refs = rng.random((refs, n)) < 0.5
    a, gamma = 0.3, 1.5
    logs = [np.log(v) for v in (p_x, refs_x)] + [in_refs] + [np.log(v) for v in (p_z, refs_z)]
    got = rmia(*logs, a, gamma)
    smooth = rmia(*logs, a, gamma, tie_break=True)
    pr_z = 0.5 * ((1 + a) * refs_z.mean(0) + 1 - a)  # z trains no reference: all OUT
    for i in range(n):  # brute force: Score(x) = mean_z 1[LR(x, z) >= gamma]
        out = ~in_refs[:, i]
        pr_x = (0.5 * ((1 + a) * refs_x[out, i].mean() + 1 - a) if out.any()
                else refs_x[:, i].mean())
        lr = (p_x[i] / pr_x) / (p_z / pr_z)
        assert got[i] == pytest.approx(np.mean(lr >= gamma), abs=TOL)
        # tie-broken: between its exact count and the count at the next population value
        assert got[i] - TOL <= smooth[i] <= got[i] + 1 / m + 1e-9 + TOL


def test_rmia_tie_break_keeps_the_order_of_the_likelihood_ratio():
    rng = np.random.default_rng(5)
    p_x, refs_x = rng.uniform(0.01, 1, 500), rng.uniform(0.01, 1, (2, 500))
    p_z, refs_z = rng.uniform(0.01, 1, 20), rng.uniform(0.01, 1, (2, 20))
    in_refs = np.zeros((2, 500), bool)
    logs = np.log(p_x), np.log(refs_x), in_refs, np.log(p_z), np.log(refs_z)
    exact = rmia(*logs, 0.5)
    smooth = rmia(*logs, 0.5, tie_break=True)
    assert len(np.unique(exact)) <= 21 < len(np.unique(smooth)) == 500  # m + 1 levels: no more
    ratio = np.log(p_x) - rmia_log_reference_probability(np.log(refs_x), in_refs, 0.5)
    order = np.argsort(ratio)
    assert np.all(np.diff(smooth[order]) > 0)  # strictly monotone in the ratio


def test_choose_rmia_a_maximises_the_auc_on_the_references_alone():
    rng = np.random.default_rng(6)
    k, n, m = 4, 300, 100
    members = rng.random((k, n)) < 0.5
    hard = rng.uniform(0.05, 0.9, n)  # per-example difficulty, shared by all models
    p_x = np.clip(hard + 0.08 * members + rng.normal(0, 0.02, (k, n)), 0.01, 1)
    p_z = np.clip(rng.uniform(0.05, 0.9, m) + rng.normal(0, 0.02, (k, m)), 0.01, 1)
    p_x, p_z = np.log(p_x), np.log(p_z)
    chosen = choose_rmia_a(p_x, members, p_z)
    assert chosen in RMIA_A_GRID

    def mean_auc(a):
        return np.mean([roc_auc_score(members[j], rmia(
            p_x[j], np.delete(p_x, j, 0), np.delete(members, j, 0), p_z[j],
            np.delete(p_z, j, 0), a, tie_break=True)) for j in range(k)])

    assert mean_auc(chosen) >= max(mean_auc(a) for a in RMIA_A_GRID) - 1e-12


def test_rmia_reference_probability_offline_interpolation():
    p = np.array([[0.8, 0.4], [0.2, 0.6]])
    in_refs = np.array([[False, True], [True, True]])
    got = np.exp(rmia_log_reference_probability(np.log(p), in_refs, a=0.5))
    assert got[0] == pytest.approx(0.5 * (1.5 * 0.8 + 0.5))  # OUT: the first reference only
    assert got[1] == pytest.approx(0.5)  # no OUT reference: the mean of all


def _rmia_in_probabilities(p_x, refs_x, in_refs, p_z, refs_z, a, gamma, tie_break):
    """The probability-space RMIA that the log-space one replaced (the reference formula)."""
    out = ~in_refs
    count = out.sum(0)
    mean_out = np.where(out, refs_x, 0.0).sum(0) / np.maximum(count, 1)
    pr_x = np.where(count > 0, 0.5 * ((1 + a) * mean_out + (1 - a)), refs_x.mean(0))
    pr_z = 0.5 * ((1 + a) * refs_z.mean(0) + (1 - a))
    ratio_x, ratio_z = p_x / pr_x / gamma, np.sort(p_z / pr_z)
    exact = np.searchsorted(ratio_z, ratio_x, side="right") / len(ratio_z)
    if not tie_break:
        return exact
    values, counts = np.unique(ratio_z, return_counts=True)
    smooth = np.interp(ratio_x, np.concatenate([[0.0], values]),
                       np.concatenate([[0.0], np.cumsum(counts) / len(ratio_z)]))
    return smooth + np.where(ratio_x > values[-1], 1e-9 * (1 - values[-1] / ratio_x), 0.0)


@pytest.mark.parametrize("tie_break", [False, True])
@pytest.mark.parametrize("a", [0.0, 0.3, 1.0])
def test_log_space_rmia_equals_the_probability_formula_where_that_was_finite(a, tie_break):
    rng = np.random.default_rng(11)
    n, m, r = 300, 40, 4
    p_x, p_z = rng.uniform(1e-6, 1, n), rng.uniform(1e-6, 1, m)
    refs_x, refs_z = rng.uniform(1e-6, 1, (r, n)), rng.uniform(1e-6, 1, (r, m))
    p_z[:5] = p_z[5:10]  # ties among the population ratios
    refs_z[:, :5] = refs_z[:, 5:10]
    in_refs = rng.random((r, n)) < 0.5
    in_refs[:, 0] = True  # an example without OUT references
    want = _rmia_in_probabilities(p_x, refs_x, in_refs, p_z, refs_z, a, 1.3, tie_break)
    got = rmia(np.log(p_x), np.log(refs_x), in_refs, np.log(p_z), np.log(refs_z), a, 1.3,
               tie_break)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e3 * np.finfo(np.float64).eps)


def test_rmia_of_a_blown_up_model_is_finite_and_ordered():
    """log-probabilities near -1900 are 0 as probabilities: the old ratios were 0 / 0."""
    rng = np.random.default_rng(12)
    n, m, r = 200, 30, 3
    log_x, log_z = rng.uniform(-1950, -1850, n), rng.uniform(-1950, -1850, m)
    refs_x, refs_z = rng.uniform(-1950, -1850, (r, n)), rng.uniform(-1950, -1850, (r, m))
    in_refs = np.zeros((r, n), bool)
    assert not np.exp(log_x).any()  # every probability underflows
    for a in (0.3, 1.0):
        for tie_break in (False, True):
            got = rmia(log_x, refs_x, in_refs, log_z, refs_z, a, 1.0, tie_break)
            assert np.isfinite(got).all() and ((got >= 0) & (got <= 1 + 1e-9)).all()
    # at a = 1 the ratios are scale-free: shifting every log-probability by -1900 changes
    # nothing, so the scores equal those of the same model at ordinary log-probabilities
    shift = 1900.0
    for tie_break in (False, True):
        far = rmia(log_x, refs_x, in_refs, log_z, refs_z, 1.0, 1.0, tie_break)
        near = rmia(log_x + shift, refs_x + shift, in_refs, log_z + shift, refs_z + shift,
                    1.0, 1.0, tie_break)
        np.testing.assert_allclose(far, near, atol=1e3 * np.finfo(np.float64).eps)
        # and the score orders the examples like the log likelihood ratio does
        lr = log_x - rmia_log_reference_probability(refs_x, in_refs, 1.0)
        order = np.argsort(lr)
        assert np.all(np.diff(far[order]) >= 0)
    chosen = choose_rmia_a(refs_x, rng.random((r, n)) < 0.5, refs_z)
    assert chosen in RMIA_A_GRID


def test_rmia_refuses_an_undefined_ratio_in_one_line():
    log_x = np.array([-1.0, np.nan, -2.0])
    refs = np.log(np.full((2, 3), 0.5))
    with pytest.raises(UndefinedScore, match="undefined on 1 pool example") as err:
        rmia(log_x, refs, np.zeros((2, 3), bool), np.log([0.3, 0.6]),
             np.log(np.full((2, 2), 0.5)), 0.3)
    assert "\n" not in str(err.value)
    # p_y = 0 exactly under the target and every OUT reference at a = 1: 0 / 0
    with pytest.raises(UndefinedScore, match="a=1"):
        rmia(np.array([-np.inf, -1.0]), np.full((2, 2), -np.inf), np.zeros((2, 2), bool),
             np.log([0.3, 0.6]), np.log(np.full((2, 2), 0.5)), 1.0)


def test_point_metrics_match_sklearn():
    rng = np.random.default_rng(2)
    members = rng.random(300) < 0.5
    scores = rng.normal(size=300) + 0.8 * members
    fpr, tpr, _ = roc_curve(members, scores)
    got = point_metrics(scores, members)
    assert got["auc"] == pytest.approx(roc_auc_score(members, scores), abs=TOL)
    for target in (0.001, 0.01, 0.1):
        assert tpr_at_fpr(*roc(scores, members), target) == pytest.approx(
            tpr[fpr <= target].max())
    assert got["balanced_accuracy"] == pytest.approx(np.max((tpr + 1 - fpr) / 2))
    assert balanced_accuracy(np.array([0.0, 1.0]), np.array([0.0, 1.0])) == 0.5


def test_epsilon_from_rates_hand_computed():
    assert epsilon_from_rates(0.5, 0.1, 0.0) == pytest.approx(math.log(5))
    assert epsilon_from_rates(0.9, 0.5, 0.0) == pytest.approx(math.log(5))  # 0.5 / 0.1
    assert epsilon_from_rates(0.3, 0.3, 1e-5) == 0.0
    assert epsilon_from_rates(0.5, 0.0, 0.0) == math.inf


def test_clopper_pearson_vectorised_equals_binomtest():
    k = np.array([0, 1, 7, 20])
    low, high = clopper_pearson_bounds(k, 20, 0.95)
    for i, kk in enumerate(k):
        want = clopper_pearson(int(kk), 20, 0.95)
        assert (low[i], high[i]) == pytest.approx(want, abs=1e-9)


def test_empirical_epsilon_is_zero_for_random_scores_and_large_for_a_perfect_attack():
    rng = np.random.default_rng(3)
    members = rng.random(400) < 0.5
    chance = empirical_epsilon(rng.normal(size=400), members, 1e-5, 0.95, rng)
    assert chance["epsilon_lower"] < 0.5
    perfect = empirical_epsilon(members.astype(float), members, 1e-5, 0.95, rng)
    # 200 right of 200: the Clopper-Pearson bounds alone cap it near log(1 / 0.018)
    assert 3.0 < perfect["epsilon_lower"] < perfect["epsilon_point"] == math.inf


def test_attack_metrics_intervals_bracket_the_point():
    rng = np.random.default_rng(4)
    members = rng.random(200) < 0.5
    scores = rng.normal(size=200) + members
    out = attack_metrics(scores, members, delta=1e-5, confidence=0.95, reps=50, rng=rng)
    for key in ("auc", "balanced_accuracy", "tpr_at_1pct_fpr"):
        assert out[f"{key}_low"] <= out[key] + 1e-12 and out[key] <= out[f"{key}_high"] + 1e-12
    assert out["auc_low"] > 0.5


def test_split_draws_each_model_from_its_own_stream():
    masks = memberships(7, 5, 1000)
    assert masks.shape == (5, 1000)
    assert all(abs(m.mean() - 0.5) < 0.06 for m in masks)
    assert len({m.tobytes() for m in masks}) == 5  # no two models share a half
    np.testing.assert_array_equal(masks, memberships(7, 5, 1000))  # reproducible
    assert len({model_seed(7, k) for k in range(5)} | {7}) == 6


def test_epsilon_point_is_none_when_no_threshold_gives_a_positive_bound():
    outcomes = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        members = rng.random(200) < 0.5
        outcomes.append(empirical_epsilon(rng.normal(size=200), members, 1e-5, 0.95, rng))
    nothing = [o for o in outcomes if o["threshold"] is None]
    assert len(nothing) >= 30  # random scores: mostly no threshold worth evaluating
    for o in nothing:
        assert o["epsilon_lower"] == 0.0 and o["epsilon_point"] is None
        assert o["tpr"] is None and o["fpr"] is None and o["ceiling"] > 0
    for o in outcomes:
        if o["threshold"] is not None:
            assert o["epsilon_point"] is not None and o["epsilon_point"] >= 0


def test_shift_images_translates_without_wrapping():
    import torch

    from dpbench.audit.mia.models import shift_images

    x = torch.arange(9.0).reshape(1, 1, 3, 3)
    assert shift_images(x, 0, 1)[0, 0].tolist() == [[0, 0, 1], [0, 3, 4], [0, 6, 7]]
    assert shift_images(x, -1, 0)[0, 0].tolist() == [[3, 4, 5], [6, 7, 8], [0, 0, 0]]
    assert torch.equal(shift_images(x, 0, 0), x)


def test_augmented_lira_is_the_mean_of_each_augmentations_score():
    rng = np.random.default_rng(8)
    refs, aug, n = 6, 3, 30
    phi_refs, phi = rng.normal(size=(refs, aug, n)), rng.normal(size=(aug, n))
    in_refs = rng.random((refs, n)) < 0.5
    for score in (lira_online, lira_offline):
        want = np.mean([score(phi[a], phi_refs[:, a], in_refs) for a in range(aug)], axis=0)
        np.testing.assert_allclose(augmented(score, phi, phi_refs, in_refs), want, rtol=1e-12)


def _blown_up_outputs(k: int = 4, n: int = 120, m: int = 60) -> ModelOutputs:
    rng = np.random.default_rng(13)
    members = rng.random((k, n)) < 0.5
    # each example's difficulty is shared by the models; members score 5 nats higher
    log_p = rng.uniform(-1950, -1850, n) + rng.normal(0, 1, (k, n)) + 5.0 * members
    log_p_z = rng.uniform(-1950, -1850, m) + rng.normal(0, 1, (k, m))
    assert not np.exp(log_p).any()  # p_y = 0 in float64
    return ModelOutputs(members=members, log_p_pool=log_p, phi_pool=log_p.copy(),
                        log_p_population=log_p_z)


def test_score_attacks_scores_a_blown_up_model_with_rmia():
    out = _blown_up_outputs()
    settings = MIASettings(pool_size=120, population_size=60, targets=2, references=2,
                           attacks=["rmia"], bootstrap=20)
    results, _, scores = score_attacks(out, settings, delta=1e-5)
    assert np.isfinite(scores["rmia"]).all()
    assert results["rmia"]["auc"] > 0.9  # the +5 on members still separates them


def test_score_attacks_refuses_an_undefined_rmia_score_as_a_dpbench_error():
    out = _blown_up_outputs()
    out.log_p_pool[0, 3] = np.nan
    settings = MIASettings(pool_size=120, population_size=60, targets=1, references=3,
                           attacks=["rmia"], bootstrap=20, rmia_a=0.3)
    with pytest.raises(TrainingDiverged, match="target 0: RMIA's likelihood ratio is "
                       "undefined on 1 pool example") as err:
        score_attacks(out, settings, delta=1e-5)
    assert "\n" not in str(err.value)


def test_members_first_auc_equals_roc_auc_score_with_ties():
    rng = np.random.default_rng(21)
    for n_pos, n_neg in ((1, 1), (7, 3), (150, 250)):
        scores = np.round(rng.normal(size=(30, n_pos + n_neg)), 1)  # many ties
        scores[0] = 0.0  # every score tied
        labels = np.arange(n_pos + n_neg) < n_pos
        want = [roc_auc_score(labels, row) for row in scores]
        np.testing.assert_allclose(members_first_auc(scores, n_pos), want, rtol=0, atol=1e-12)


def _bootstrap_with_sklearn(scores, members, reps, confidence, rng):
    """The replicate-by-replicate bootstrap the ranked one replaced (the reference)."""
    inside, outside = np.flatnonzero(members), np.flatnonzero(~members)
    draws = {}
    for _ in range(reps):
        idx = np.concatenate([rng.choice(inside, len(inside)), rng.choice(outside, len(outside))])
        fpr, tpr, _ = roc_curve(members[idx], scores[idx], drop_intermediate=False)
        draws.setdefault("auc", []).append(roc_auc_score(members[idx], scores[idx]))
        draws.setdefault("balanced_accuracy", []).append(balanced_accuracy(fpr, tpr))
        for name, p in FPR_POINTS.items():
            draws.setdefault(name, []).append(tpr_at_fpr(fpr, tpr, p))
    tail = 100 * (1 - confidence) / 2
    return {k: (np.percentile(v, tail), np.percentile(v, 100 - tail)) for k, v in draws.items()}


def test_ranked_bootstrap_keeps_the_random_stream_and_the_intervals():
    rng = np.random.default_rng(22)
    members = rng.random(400) < 0.4
    scores = np.round(rng.normal(size=400) + 0.7 * members, 2)  # ties
    want = _bootstrap_with_sklearn(scores, members, 150, 0.95, np.random.default_rng(5))
    got_rng = np.random.default_rng(5)
    got = bootstrap_intervals(scores, members, 150, 0.95, got_rng)
    assert list(got) == list(want)  # the record's key order too
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-12)
    # the same number of draws were taken: the epsilon split that follows is unchanged
    ref_rng = np.random.default_rng(5)
    _bootstrap_with_sklearn(scores, members, 150, 0.95, ref_rng)
    assert got_rng.integers(1 << 62) == ref_rng.integers(1 << 62)


def test_fixed_seed_cell_metrics_unchanged_by_the_ranked_bootstrap(monkeypatch):
    out = _blown_up_outputs()
    out.log_p_pool += 1900.0  # an ordinary model
    out.log_p_population += 1900.0
    out.phi_pool = out.log_p_pool - np.log1p(-np.exp(np.minimum(out.log_p_pool, -1e-9)))
    settings = MIASettings(pool_size=120, population_size=60, targets=2, references=2,
                           bootstrap=60)
    got = score_attacks(out, settings, delta=1e-5)[0]
    monkeypatch.setattr(mia_metrics, "bootstrap_intervals", _bootstrap_with_sklearn)
    want = score_attacks(out, settings, delta=1e-5)[0]
    assert got.keys() == want.keys()
    for attack in want:
        assert got[attack].keys() == want[attack].keys()
        for key, value in want[attack].items():
            if isinstance(value, float):
                assert got[attack][key] == pytest.approx(value, rel=0, abs=1e-12), (attack, key)
            else:
                assert got[attack][key] == value, (attack, key)


@pytest.mark.parametrize("attack", ["loss", "lira_offline", "lira_online"])
def test_score_attacks_refuses_a_nan_model_output_in_one_line(attack):
    out = _blown_up_outputs()
    out.log_p_pool[0, 3] = np.nan
    out.phi_pool[0, 3] = np.nan
    settings = MIASettings(pool_size=120, population_size=60, targets=1, references=3,
                           attacks=[attack], headline=attack, bootstrap=20)
    with pytest.raises(TrainingDiverged, match=f"attack {attack} gave 1 non-finite score") as err:
        score_attacks(out, settings, delta=1e-5)
    assert "\n" not in str(err.value)
