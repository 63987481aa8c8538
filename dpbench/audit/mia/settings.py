"""``conf/mia/*.yaml``: what dpbench-mia trains and how it scores (docs/empirical-privacy.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dpbench.audit.mia.attacks import ATTACKS
from dpbench.errors import ConfigError

AUTO = "auto"
LIRA_VARIANCES = ("auto", "global", "per_example")
#: ``lira_variance=auto`` fits per-example widths from this many references per target
PER_EXAMPLE_FROM = 16


@dataclass
class MIASettings:
    """The pool, the models, the attacks and their statistics."""

    pool_size: int = 500  # examples of the training split the models' halves are drawn from
    population_size: int = 300  # RMIA's population samples z, from the test split
    targets: int = 1  # models attacked in turn (each with all the others as references)
    references: int = 4  # further models trained only as references (shadow models)
    attacks: list[str] = field(default_factory=lambda: list(ATTACKS))
    headline: str = "rmia"  # the attack whose numbers the report's columns show
    #: offline RMIA's Pr(x) = ((1 + a) Pr_OUT(x) + 1 - a) / 2; auto: chosen on the reference
    #: models (``attacks.choose_rmia_a``), as the authors do
    rmia_a: float | str = "auto"
    rmia_tie_break: bool = True  # interpolate RMIA's count between population samples
    #: LiRA's Gaussian widths: global (pooled), per_example, or auto (per_example from
    #: ``PER_EXAMPLE_FROM`` references per target, Carlini et al.'s choice with many models)
    lira_variance: str = "auto"
    #: LiRA queries each image and its shifted copies (``models.SHIFTS``) and averages the
    #: scores (Carlini et al. 2022, Sec. VI-B); image inputs only
    lira_augment: bool = False
    rmia_gamma: float = 1.0  # RMIA's likelihood-ratio threshold
    confidence: float = 0.95  # of the bootstrap intervals and the epsilon lower bound
    bootstrap: int = 200  # bootstrap replicates
    seed: int = 0  # the run seed (the split, the models, the bootstrap)
    #: TESTS ONLY: every model's noise drawn at this fraction of its calibrated scale while the
    #: planned epsilon is still accounted (a hidden noise bug the warnings must catch)
    break_noise_scale: float = 1.0

    def __post_init__(self) -> None:
        for key, low in (("pool_size", 8), ("population_size", 1), ("targets", 1),
                         ("references", 1), ("bootstrap", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"mia.{key} must be an integer >= {low} (got {value!r})")
        unknown = [a for a in self.attacks if a not in ATTACKS]
        if unknown or not self.attacks:
            raise ConfigError(f"mia.attacks must name some of {', '.join(ATTACKS)} "
                              f"(got {self.attacks!r})")
        if self.headline not in self.attacks:
            raise ConfigError(f"mia.headline must be one of mia.attacks (got {self.headline!r})")
        if self.targets + self.references < 3 and any(a.startswith("lira")
                                                       for a in self.attacks):
            raise ConfigError("mia.targets + mia.references must be at least 3 for LiRA "
                              "(its Gaussians need two reference models)")
        if self.rmia_a != AUTO and (isinstance(self.rmia_a, bool) or not isinstance(
                self.rmia_a, (int, float)) or not 0 <= self.rmia_a <= 1):
            raise ConfigError(f"mia.rmia_a must be in [0, 1] or auto (got {self.rmia_a!r})")
        if self.rmia_a == AUTO and "rmia" in self.attacks and self.models < 3:
            raise ConfigError("mia.rmia_a=auto chooses a on two or more reference models per "
                              "target: set mia.targets + mia.references >= 3 or a number")
        if self.lira_variance not in LIRA_VARIANCES:
            raise ConfigError(f"mia.lira_variance must be one of {', '.join(LIRA_VARIANCES)} "
                              f"(got {self.lira_variance!r})")
        if not isinstance(self.lira_augment, bool):
            raise ConfigError(f"mia.lira_augment must be true or false (got "
                              f"{self.lira_augment!r})")
        if not isinstance(self.rmia_tie_break, bool):
            raise ConfigError(f"mia.rmia_tie_break must be true or false (got "
                              f"{self.rmia_tie_break!r})")
        if not self.rmia_gamma > 0:
            raise ConfigError(f"mia.rmia_gamma must be > 0 (got {self.rmia_gamma})")
        if not 0 <= self.break_noise_scale <= 1:
            raise ConfigError("mia.break_noise_scale must be in [0, 1] (got "
                              f"{self.break_noise_scale})")
        if not 0 < self.confidence < 1:
            raise ConfigError(f"mia.confidence must be in (0, 1) (got {self.confidence})")

    @property
    def models(self) -> int:
        return self.targets + self.references

    @property
    def lira_per_example(self) -> bool:
        """Whether LiRA fits a width per example (each target has models - 1 references)."""
        if self.lira_variance == AUTO:
            return self.models - 1 >= PER_EXAMPLE_FROM
        return self.lira_variance == "per_example"
