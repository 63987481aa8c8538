"""Re-derive what a file says (results.json, a checkpoint) from the mechanism it names.

A file is not trusted: ``check_ledger`` accepts a ledger only if it is exactly the plan's
mechanism for the steps that ran (a resumed run rebuilds its ledger and accountant from it,
``training/run_state.py``); ``check_record_epsilon`` re-derives a record's epsilon from its own
ledger by its accountant (every sampler) and refuses one that disagrees (the readers and the
job wrapper call it). ``ledger_epsilon`` re-derives epsilon from any run's ledger with
dp-accounting directly: Poisson entries by ``verify.pld_epsilon``; entries of another sampler
(``sampling``: sampler, neighbouring relation, N, B, steps per epoch) from the events
``samplers.dp_event_for`` states for it, with dp-accounting's PLD accountant, or its RDP
accountant under replace-one where the PLD accountant has no such event (``fixed_size``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpbench.privacy.verify import ledger_noise_multiplier, pld_epsilon

#: a ledger's combined multiplier may differ from the plan's by float rounding only (the
#: loop refuses a release below the plan at the same tolerance, ``plan.account_release``)
SIGMA_RTOL = 1e-9
#: a stated epsilon must equal the one re-derived from its ledger this closely
EPSILON_RTOL = 1e-6


class LedgerMismatch(ValueError):
    """A file's ledger or epsilon disagrees with the mechanism it names (one line, says which)."""


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LedgerMismatch(f"{what} is not a finite number ({value!r})")
    return float(value)


def accounted_steps(steps: int, bands: int) -> int:
    """Return how many accountant steps ``steps`` loop steps are: ceil(steps / b)
    (cyclic Poisson over b bands accounts the first step of every b, ``plan.account_release``)."""
    return -(-int(steps) // max(int(bands), 1))


def check_ledger(ledger: Any, *, noise_multiplier: float, sample_rate: float, bands: int,
                 steps: int, what: str = "privacy_ledger") -> list[dict[str, Any]]:
    """Return ``ledger`` if it is exactly the plan's mechanism run for ``steps`` loop steps.

    The plan fixes the mechanism (the loop refuses any other): every entry Poisson-samples at
    rate b q, its queries combine (``ledger_noise_multiplier``, recomputed from their raw
    sensitivities and noise) to the calibrated sigma, and the entries hold ceil(steps / b)
    accountant steps. Anything else raises LedgerMismatch naming ``what``: an emptied ledger,
    a raised sigma, a lowered rate or a step count that does not match.
    """
    sigma = _number(noise_multiplier, f"{what}: the plan's noise_multiplier")
    rate = _number(sample_rate, f"{what}: the plan's sample_rate") * max(int(bands), 1)
    if not isinstance(ledger, list):
        raise LedgerMismatch(f"{what} is not a list of ledger entries")
    total = 0
    for i, entry in enumerate(ledger):
        where = f"{what}[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("queries"), list) or not all(
                isinstance(q, dict) for q in entry["queries"]):
            raise LedgerMismatch(f"{where} is not a ledger entry with its queries")
        n = entry.get("steps")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise LedgerMismatch(f"{where}.steps is not an integer >= 0 ({n!r})")
        if not math.isclose(_number(entry.get("sample_rate"), f"{where}.sample_rate"), rate,
                            rel_tol=1e-12):
            raise LedgerMismatch(f"{where}.sample_rate is {entry.get('sample_rate')!r}, not the "
                                 f"plan's {rate:.6g}")
        try:
            for q in entry["queries"]:
                _number(q.get("sensitivity"), f"{where}.queries.sensitivity")
                _number(q.get("noise_std"), f"{where}.queries.noise_std")
            combined = ledger_noise_multiplier(entry)
        except (KeyError, TypeError) as err:
            raise LedgerMismatch(f"{where}.queries are not (sensitivity, noise_std) queries "
                                 f"({err})") from None
        stored = _number(entry.get("noise_multiplier"), f"{where}.noise_multiplier")
        if not (math.isclose(combined, sigma, rel_tol=SIGMA_RTOL)
                and math.isclose(stored, sigma, rel_tol=SIGMA_RTOL)):
            raise LedgerMismatch(f"{where} noise multiplier is {combined:.6g} (stored "
                                 f"{stored:.6g}), not the plan's {sigma:.6g}")
        total += n
    expected = accounted_steps(steps, bands)
    if total != expected:
        raise LedgerMismatch(f"{what} holds {total} accounted steps, but {steps} steps ran "
                             f"(expected {expected})")
    return ledger


def ledger_history(ledger: list[dict[str, Any]]) -> list[tuple[float, float, int]]:
    """Return the accountant's (sigma, q, steps) history of a checked ledger, in order,
    merged as ``PrivacyAccountant.step`` merges consecutive equal (sigma, q)."""
    history: list[tuple[float, float, int]] = []
    for entry in ledger:
        if entry["steps"] <= 0:
            continue
        key = (float(entry["noise_multiplier"]), float(entry["sample_rate"]))
        if history and history[-1][:2] == key:
            history[-1] = (*key, history[-1][2] + int(entry["steps"]))
        else:
            history.append((*key, int(entry["steps"])))
    return history


def check_record_epsilon(record: Mapping[str, Any], what: str = "results.json"
                         ) -> float | None:
    """Return the epsilon re-derived from a record's own mechanism; LedgerMismatch if it
    disagrees with what the record states.

    The record's plan facts (noise_multiplier, sample_rate, participation_bands, steps) fix
    the ledger (``check_ledger``); the epsilon is recomputed from the ledger by the record's
    accountant at its delta, and must equal the stated one (``EPSILON_RTOL``). A completed
    record calibrated to a target must spend it (calibration lands within its tolerance
    below the target): a raised sigma is refused. Returns None for a non-private record
    (epsilon infinite) and for one that states no epsilon.
    """
    from dpbench.privacy.calibration import RELATIVE_TOLERANCE

    if record.get("private") is False:
        if record.get("epsilon") is not None and record.get("epsilon") != math.inf:
            raise LedgerMismatch(f"{what}: a non-private run states epsilon "
                                 f"{record.get('epsilon')!r}")
        return None
    stated = record.get("epsilon")
    if stated is None and "privacy_ledger" not in record:
        return None
    ledger = record.get("privacy_ledger")
    if ledger is None:
        raise LedgerMismatch(f"{what} states epsilon {stated!r} but has no privacy_ledger to "
                             "derive it from")
    ledger, steps, delta, sampling = _checked_ledger(record, ledger, what)
    accountant = record.get("accountant")
    history = ledger_history(ledger)
    derived = _accounted(history, sampling, delta, accountant, what, _record_user(record, what))
    if stated is None or not math.isclose(_number(stated, f"{what}: epsilon"), derived,
                                          rel_tol=EPSILON_RTOL, abs_tol=1e-12):
        raise LedgerMismatch(f"{what} states epsilon {stated!r}, but its ledger gives "
                             f"{derived:.6g}")
    _check_total(record, ledger, derived, delta, accountant, what)
    target = record.get("target_epsilon")
    planned = record.get("planned_steps")
    if (record.get("status") == "completed" and isinstance(target, (int, float))
            and steps == planned and derived < target * (1 - 2 * RELATIVE_TOLERANCE)):
        raise LedgerMismatch(f"{what} spends epsilon {derived:.6g}, below its target {target:g} "
                             "less the calibration's tolerance: its noise is not the calibrated "
                             "one")
    if isinstance(target, (int, float)) and derived > target * (1 + EPSILON_RTOL):
        # calibration lands at or below the target: a run above it was not run for it
        raise LedgerMismatch(f"{what} spends epsilon {derived:.6g}, above its target "
                             f"{target:g}: it was not run for that target")
    return derived


def _ledger_sampling(record: Mapping[str, Any], ledger: list[dict[str, Any]],
                     what: str) -> Any:
    """Return the ``Sampling`` the ledger's entries name (None: Poisson under add/remove),
    which must be one for every entry and agree with the record's ``sampler``,
    ``neighbouring``, ``dataset_size`` and rate; its steps per epoch are re-derived from its
    own N and B (``samplers.steps_per_epoch``), never read. LedgerMismatch otherwise."""
    from dpbench.privacy.samplers import ADD_REMOVE, Sampling, steps_per_epoch

    specs = [e.get("sampling") for e in ledger]
    if any(spec != specs[0] for spec in specs):
        raise LedgerMismatch(f"{what}: privacy_ledger mixes samplers")
    named = record.get("sampler", "poisson")
    relation = record.get("neighbouring") or ADD_REMOVE
    if not specs or specs[0] is None:
        if named != "poisson" or relation != ADD_REMOVE:
            raise LedgerMismatch(f"{what}: sampler {named!r} under {relation!r} but a Poisson "
                                 "add/remove privacy_ledger")
        return None
    try:
        if not isinstance(specs[0], Mapping):
            raise TypeError("not a mapping")
        sampling = Sampling(**specs[0])
    except TypeError as err:
        raise LedgerMismatch(f"{what}: privacy_ledger's sampling is not a sampler ({err})"
                             ) from None
    key = f"{what}: privacy_ledger[0].sampling"
    if sampling.sampler != named or sampling.ledger_spec() is None:
        raise LedgerMismatch(f"{what}: sampler {named!r} but the ledger names "
                             f"{sampling.sampler!r} under {sampling.neighbouring!r}")
    if sampling.neighbouring != relation:
        raise LedgerMismatch(f"{key}.neighbouring is {sampling.neighbouring!r}, but the record's "
                             f"neighbouring is {relation!r}")
    n, b = sampling.dataset_size, sampling.batch_size
    for field, value in (("dataset_size", n), ("batch_size", b),
                         ("steps_per_epoch", sampling.steps_per_epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LedgerMismatch(f"{key}.{field} is not an integer >= 1 ({value!r})")
    if b > n:
        raise LedgerMismatch(f"{key}.batch_size {b} exceeds its dataset_size {n}")
    if record.get("dataset_size") is not None and record.get("dataset_size") != n:
        raise LedgerMismatch(f"{key}.dataset_size is {n}, but the record's dataset_size is "
                             f"{record.get('dataset_size')!r}")
    rate = record.get("sample_rate")
    if isinstance(rate, (int, float)) and not math.isclose(b / n, rate, rel_tol=1e-9):
        raise LedgerMismatch(f"{key}: batch_size / dataset_size = {b}/{n}, but the record's "
                             f"sample_rate is {rate!r}")
    expected = steps_per_epoch(n, b)
    if sampling.steps_per_epoch != expected:
        raise LedgerMismatch(f"{key}.steps_per_epoch is {sampling.steps_per_epoch}, but its own "
                             f"N = {n} and B = {b} give {expected}")
    return sampling


def _check_convention(record: Mapping[str, Any], sampling: Any, what: str,
                      user: Any = None) -> None:
    """Refuse a record whose ``mechanism.convention`` (or ``mechanism.neighbouring``) is not
    the one its ledger's sampler and relation state (``samplers.convention``): a reader
    following it would double-count or halve the replace-one factor 2. Records written
    before the field have none (nothing to check)."""
    from dpbench.privacy.samplers import Sampling, convention

    mechanism = record.get("mechanism")
    if not isinstance(mechanism, Mapping):
        return
    expected = convention(sampling or Sampling())
    if user is not None:  # a user-level record: its strategy's reading (user_level.py)
        from dpbench.privacy.user_level import user_convention

        expected = user_convention(user, (sampling or Sampling()).neighbouring)
    stated = mechanism.get("convention")
    if stated is not None and stated != expected:
        raise LedgerMismatch(
            f"{what}: mechanism.convention is {stated!r}, but its ledger's "
            f"{(sampling or Sampling()).sampler} under {expected['neighbouring']} has "
            f"multipliers relative to {expected['multiplier_relative_to']}, read by "
            + ", ".join(f"{p['accountant']} {p['neighboring_relation']}"
                        for p in expected["read_by"]))
    relation = mechanism.get("neighbouring")
    if relation is not None and relation != expected["neighbouring"]:
        raise LedgerMismatch(f"{what}: mechanism.neighbouring is {relation!r}, but its ledger "
                             f"is under {expected['neighbouring']!r}")


def _check_total(record: Mapping[str, Any], ledger: list[dict[str, Any]], derived: float,
                 delta: float, accountant: Any, what: str) -> None:
    """Refuse a tuned record whose ``tuning.total_epsilon`` is not search + run re-derived
    from its search's ledger and selection epsilon (``selection.search_and_run_epsilon``)."""
    from dpbench.privacy.selection import search_and_run_epsilon

    tuning = record.get("tuning")
    if not isinstance(tuning, Mapping) or tuning.get("mode") != "accounted":
        return
    search = tuning.get("search_ledger")
    if not isinstance(search, list) or not all(
            isinstance(e, Mapping) and isinstance(e.get("steps"), int) for e in search):
        raise LedgerMismatch(f"{what}: an accounted tuning without its search_ledger")
    selection = _number(tuning.get("selection_epsilon"), f"{what}: tuning.selection_epsilon")
    try:
        total = search_and_run_epsilon(list(search), selection, ledger, derived, delta,
                                       accountant)
    except (KeyError, TypeError, ValueError) as err:
        raise LedgerMismatch(f"{what}: its search_ledger cannot be accounted ({err})") from None
    stated = tuning.get("total_epsilon")
    if isinstance(stated, bool) or not isinstance(stated, (int, float)) or not math.isclose(
            stated, total, rel_tol=EPSILON_RTOL, abs_tol=1e-12):
        raise LedgerMismatch(f"{what} states tuning.total_epsilon {stated!r}, but its "
                             f"search and run give {total:.6g}")


def ledger_epsilon(ledger: list[Mapping[str, Any]], delta: float) -> float:
    """Return epsilon at ``delta`` re-derived from any run's ledger, its sampler included.

    Poisson entries under add/remove (no ``sampling``) go to ``pld_epsilon``; a ledger of one
    other sampler or relation is composed from ``dp_event_for``'s events by dp-accounting
    directly, with the accountant and relation its ``convention`` names first (PLD where it
    reads them, else RDP)."""
    from dpbench.privacy.samplers import Sampling, convention, dp_event_for, events_relation

    specs = {tuple(sorted(e["sampling"].items())) if e.get("sampling") else None
             for e in ledger}
    if specs == {None} or not ledger:
        return pld_epsilon(ledger, delta)
    if len(specs) != 1:
        raise ValueError("a ledger mixes samplers; each run has one")
    sampling = Sampling(**ledger[0]["sampling"])
    history = [(ledger_noise_multiplier(e), float(e["sample_rate"]), int(e["steps"]))
               for e in ledger]
    if any(s == 0.0 for s, _, k in history if k > 0):
        return math.inf
    history = [(s, q, k) for s, q, k in history if not math.isinf(s)]
    if not history:
        return 0.0
    relation = events_relation(sampling)
    if not any(p["accountant"] == "pld" for p in convention(sampling)["read_by"]):
        from dp_accounting.rdp import rdp_privacy_accountant as rdp

        accountant = rdp.RdpAccountant(neighboring_relation=relation)
    else:
        from dp_accounting.pld import pld_privacy_accountant

        accountant = pld_privacy_accountant.PLDAccountant(
            neighboring_relation=relation, value_discretization_interval=1e-4)
    accountant.compose(dp_event_for(sampling, history))
    return float(accountant.get_epsilon(delta))


def epsilon_after(record: Mapping[str, Any], step: int, what: str = "results.json") -> float:
    """Return the epsilon the record's own ``privacy_ledger`` gives after its first ``step``
    loop steps, by its accountant at its delta and under its sampler, as
    ``check_record_epsilon`` derives the final one: what a ``history`` or ``step_history``
    row at that step must state, re-derived rather than read. LedgerMismatch (one line) if
    the ledger does not check or ends before ``step``; infinity for a non-private record."""
    if record.get("private") is False:
        return math.inf
    ledger = record.get("privacy_ledger")
    if ledger is None:
        raise LedgerMismatch(f"{what} has no privacy_ledger to derive an epsilon from")
    ledger, steps, delta, sampling = _checked_ledger(record, ledger, what)
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= steps:
        raise LedgerMismatch(f"{what}: step {step!r} is not one of its {steps} steps")
    left, prefix = accounted_steps(step, record.get("participation_bands") or 1), []
    for entry in ledger:
        take = min(int(entry["steps"]), left)
        if take > 0:
            prefix.append({**entry, "steps": take})
            left -= take
    return _accounted(ledger_history(prefix), sampling, delta, record.get("accountant"), what,
                      _record_user(record, what))


def _record_user(record: Mapping[str, Any], what: str) -> Any:
    """Return the record's user-level strategy and k (``user_level.UserLevel``) when its
    ``privacy_unit`` is ``user``, else None; LedgerMismatch if it names no valid one. The
    ledger's steps are then accounted by that strategy's accountant (the unit followed)."""
    if record.get("privacy_unit") != "user":
        return None
    from dpbench.privacy.user_level import UserLevel

    facts = record.get("user_level")
    if not isinstance(facts, Mapping):
        raise LedgerMismatch(f"{what}: privacy_unit is user but it has no user_level")
    try:
        return UserLevel(facts.get("strategy"), facts.get("max_examples_per_user"))
    except Exception as err:  # noqa: BLE001 - a one-line ConfigError naming the key
        raise LedgerMismatch(f"{what}: user_level is not a user-level strategy ({err})"
                             ) from None


def _checked_ledger(record: Mapping[str, Any], ledger: Any, what: str
                    ) -> tuple[list[dict[str, Any]], int, float, Any]:
    """Return (the checked ledger, steps, delta, its ``Sampling``): the record's plan facts
    fix the ledger (``check_ledger``), its sampler's facts and convention are the record's own;
    LedgerMismatch (one line naming the key) otherwise."""
    steps = record.get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise LedgerMismatch(f"{what}: steps is not an integer >= 0 ({steps!r})")
    bands = record.get("participation_bands") or 1
    if isinstance(bands, bool) or not isinstance(bands, int) or bands < 1:
        raise LedgerMismatch(f"{what}: participation_bands is not an integer >= 1 ({bands!r})")
    ledger = check_ledger(ledger, noise_multiplier=record.get("noise_multiplier"),
                          sample_rate=record.get("sample_rate"), bands=bands, steps=steps,
                          what=f"{what}: privacy_ledger")
    delta = _number(record.get("delta"), f"{what}: delta")
    if not 0 < delta < 1:
        raise LedgerMismatch(f"{what}: delta {delta!r} is not in (0, 1)")
    sampling = _ledger_sampling(record, ledger, what)
    _check_convention(record, sampling, what, _record_user(record, what))
    return ledger, steps, delta, sampling


def _accounted(history: Any, sampling: Any, delta: float, accountant: Any, what: str,
               user: Any = None) -> float:
    """Return the epsilon of a ledger's ``history`` under its sampler (None: Poisson under
    add/remove) by ``accountant`` at ``delta``; LedgerMismatch if it cannot be accounted.
    ``user`` (a user-level record): by the strategy's accountant (``user_level``)."""
    from dpbench.privacy.accountant import compose_epsilon

    try:
        if not history:
            return 0.0
        if user is not None:
            from dpbench.privacy.samplers import ADD_REMOVE
            from dpbench.privacy.user_level import user_epsilon

            return user_epsilon(user, history, delta, accountant,
                                sampling.neighbouring if sampling is not None else ADD_REMOVE)
        if sampling is None:
            return compose_epsilon(history, delta, accountant)
        from dpbench.privacy.accountant import epsilon as poisson_epsilon
        from dpbench.privacy.samplers import resolve_sampling, sampling_epsilon

        resolve_sampling(sampling.sampler, sampling.neighbouring, accountant)
        return sampling_epsilon(sampling, accountant, history, delta, poisson_epsilon)
    except Exception as err:  # noqa: BLE001 - an unknown accountant or an unaccountable ledger
        raise LedgerMismatch(f"{what}: its ledger cannot be accounted ({err})") from None
