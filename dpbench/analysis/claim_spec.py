"""A claim as a spec declares it: its kinds, default sizes, the checks that refuse a
meaningless test, and the selection of the runs it reads (docs/tuning-and-claims.md,
"Declared claims" and "Margins")."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

KINDS = ("superiority", "non_inferiority", "equivalence", "threshold", "interaction")
#: the share of the claimed effect (the paper's, or the declared smallest effect of interest)
#: that a superiority claim must be shown to exceed to be reproduced
FRACTION = 0.5
#: a threshold claim's default tolerance, as a share of the threshold: the mean shown within
#: it on the claimed side reads "smaller than claimed" (so that a mean at the threshold is
#: decided too)
THRESHOLD_TOLERANCE = 0.1
#: the failure rate of a method's runs above which (its Clopper-Pearson interval wholly
#: above it) a claim reads "failed runs"; a spec may declare ``max_failure_rate``
FAILURE_LIMIT = 0.05
#: per metric: ``effect``, the smallest effect of interest of a claim whose paper gives no
#: number; ``margin``, the margin of non-inferiority and equivalence; ``*_relative``: as a
#: share of the baseline's mean. Each is justified in docs/tuning-and-claims.md ("Margins").
METRIC_DEFAULTS: dict[str, dict[str, float]] = {
    "accuracy": {"effect": 0.01, "margin": 0.01},
    "worst_class_accuracy": {"effect": 0.01, "margin": 0.01},
    "macro_accuracy": {"effect": 0.01, "margin": 0.01},
    "ece": {"effect": 0.01, "margin": 0.01},
    "rmse": {"effect_relative": 0.05, "margin_relative": 0.10},
    "mae": {"effect_relative": 0.05, "margin_relative": 0.10},
    "crps": {"effect_relative": 0.05, "margin_relative": 0.10},
    "mia_tpr_at_1pct_fpr": {"effect": 0.01, "margin": 0.01},
    "mia_auc": {"effect": 0.02, "margin": 0.02},
}


class ClaimSpecError(ValueError):
    """A claim declared in a spec that cannot be tested as written; the message is one line
    naming the claim and the key."""


_POSITIVE = ("paper_effect", "effect", "effect_relative", "margin", "margin_relative",
             "tolerance")


def claim_name(claim: dict[str, Any]) -> str:
    return str(claim.get("id", claim.get("claim", "?")))


def validate_claim(claim: dict[str, Any]) -> None:
    """Raise ClaimSpecError (one line: the claim and the key) for a claim whose test would be
    meaningless: an unknown kind; a size that is not a positive number; a relative effect
    on an interaction or a steps saving (it would be a share of the baseline's mean of a
    difference, or of a share of steps); a steps saving or an interaction without an
    absolute effect (a metric's default is in the metric's units, not in steps);
    ``fraction`` or ``max_failure_rate`` outside (0, 1); a threshold without ``threshold``."""
    name = claim_name(claim)
    kind = claim.get("kind", "superiority")

    def fail(key: str, why: str) -> None:
        raise ClaimSpecError(f"claim {name!r}: key {key!r}: {why}")

    if kind not in KINDS:
        fail("kind", f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
    for key in _POSITIVE:
        value = claim.get(key)
        if key in claim and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                 and math.isfinite(value) and value > 0):
            fail(key, f"must be a positive number (got {value!r})")
    for key, default in (("fraction", FRACTION), ("max_failure_rate", FAILURE_LIMIT)):
        value = claim.get(key, default)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool)
                and 0 < value < 1):
            fail(key, f"must lie strictly between 0 and 1 (got {value!r})")
    steps = claim.get("statistic") == "steps_saving"
    if steps or kind == "interaction":
        what = "a steps saving" if steps else "an interaction"
        for key in ("effect_relative", "margin_relative"):
            if key in claim:
                fail(key, f"a relative size is undefined for {what} (declare 'effect')")
        if "paper_effect" not in claim and "effect" not in claim:
            fail("paper_effect" if steps else "effect",
                 f"{what} needs an absolute size (the metric's default is in its own units)")
    if kind == "threshold" and not isinstance(claim.get("threshold"), (int, float)):
        fail("threshold", "a threshold claim needs a number")
    if kind == "threshold" and claim.get("threshold") == 0 and "tolerance" not in claim:
        fail("tolerance", "a threshold of 0 needs a declared tolerance")
    if kind == "interaction":
        contrast = claim.get("contrast") or {}
        if "key" not in contrast or len(contrast.get("values") or []) != 2:
            fail("contrast", "an interaction needs contrast.key and two contrast.values")


# --- the runs a claim reads -----------------------------------------------------------------

def lookup(record: dict[str, Any], key: str) -> Any:
    """Return ``record[key]`` for a dotted key (``config.method.settings.filter``)."""
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def matches(record: dict[str, Any], where: dict[str, Any]) -> bool:
    for key, wanted in where.items():
        value = lookup(record, key)
        if isinstance(value, float) and isinstance(wanted, (int, float)):
            if not math.isclose(value, float(wanted)):
                return False
        elif value != wanted:
            return False
    return True


def select(records: Iterable[dict[str, Any]], method: str | None, where: dict[str, Any],
           sweeps: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Return the records of ``method`` matching ``where`` (and in ``sweeps``, if given)."""
    return [r for r in records if (method is None or r.get("method_name") == method)
            and (not sweeps or r.get("_sweep") in sweeps) and matches(r, where)]


def metric_value(record: dict[str, Any], metric: str) -> float | None:
    """Return the record's finite ``metric`` (from ``metrics``, the top level, or a dotted
    key), None if it has none."""
    value = (record.get("metrics") or {}).get(metric, record.get(metric))
    if value is None and "." in metric:
        value = lookup(record, metric)  # e.g. method_summary.floor_binding_share
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def expand_cells(where: dict[str, Any]) -> list[dict[str, Any]]:
    """Expand list-valued ``where`` entries into one cell per value (cartesian product)."""
    cells: list[dict[str, Any]] = [{}]
    for key, value in where.items():
        values = value if isinstance(value, list) else [value]
        cells = [{**c, key: v} for c in cells for v in values]
    return cells


def cell_label(cell: dict[str, Any], where: dict[str, Any]) -> str:
    """Name the cell by the ``where`` keys that vary (list-valued) only."""
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in cell.items()
                     if isinstance(where.get(k), list))


def claim_sweeps(claim: dict[str, Any]) -> list[str] | None:
    sweeps = claim.get("sweep")
    return [sweeps] if isinstance(sweeps, str) else sweeps


# --- sizes in the gain's units ------------------------------------------------------------

def _defaults(claim: dict[str, Any], name: str) -> tuple[float | None, float | None]:
    """Return (absolute, relative) of ``effect`` or ``margin``: the claim's, else the metric's."""
    base = METRIC_DEFAULTS.get(claim["metric"].split(".")[-1], {})
    if f"{name}_relative" in claim:
        return None, float(claim[f"{name}_relative"])
    if name in claim:
        return float(claim[name]), None
    if name in base:
        return base[name], None
    if f"{name}_relative" in base:
        return None, base[f"{name}_relative"]
    return None, None


def scaled(claim: dict[str, Any], name: str, baseline_mean: float) -> float:
    """Return the claim's ``effect`` or ``margin`` in the metric's units (a relative one as a
    share of the baseline's mean in the cell)."""
    absolute, relative = _defaults(claim, name)
    if absolute is not None:
        return absolute
    if relative is not None:
        return relative * abs(baseline_mean)
    raise ValueError(f"claim {claim_name(claim)!r}: no {name} for metric "
                     f"{claim['metric']!r} (declare '{name}' or '{name}_relative')")


def edges(claim: dict[str, Any], baseline_mean: float) -> tuple[float, float]:
    """Return (target, claimed) of a difference claim in gain units: the gain the claim must
    be shown to exceed, and the effect the paper (or the declared smallest effect of
    interest) states; for equivalence (margin, 0)."""
    kind = claim["kind"]
    if kind in ("non_inferiority", "equivalence"):
        margin = scaled(claim, "margin", baseline_mean)
        return (-margin, 0.0) if kind == "non_inferiority" else (margin, 0.0)
    paper = claim.get("paper_effect")
    claimed = float(paper) if paper is not None else scaled(claim, "effect", baseline_mean)
    return float(claim.get("fraction", FRACTION)) * claimed, claimed
