"""A sweep composes each job's configuration once: Hydra's validation of a batch and the
launcher's run of each job share one composition (``dpbench.config.compose_once``)."""

from __future__ import annotations

from omegaconf import OmegaConf

from dpbench.config.compose_once import MAX_KEPT, ComposedOnce


class _Loader:
    """The part of Hydra's config loader the sweeper calls; counts compositions."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def load_sweep_config(self, master_config, sweep_overrides):
        self.calls.append(tuple(sweep_overrides))
        return OmegaConf.create({"overrides": list(sweep_overrides), "n": len(self.calls)})


def _validate_then_launch(loader: ComposedOnce, master, jobs):
    for job in jobs:  # Sweeper.validate_batch_is_legal: composed and dropped
        loader.load_sweep_config(master, list(job))
    return [loader.load_sweep_config(master, list(job)) for job in jobs]  # the launcher's


def test_each_job_is_composed_once_and_runs_its_own_composition():
    inner, master = _Loader(), OmegaConf.create({})
    loader = ComposedOnce(inner)
    jobs = [[f"seed={k}"] for k in range(5)]
    launched = _validate_then_launch(loader, master, jobs)
    assert inner.calls == [tuple(job) for job in jobs] and loader.compositions == 5
    assert [cfg.overrides for cfg in launched] == jobs  # each job its own, never another's
    assert loader.kept == {}


def test_a_composition_is_handed_out_once():
    inner, master = _Loader(), OmegaConf.create({})
    loader = ComposedOnce(inner)
    first = loader.load_sweep_config(master, ["seed=0"])
    assert loader.load_sweep_config(master, ["seed=0"]) is first
    assert loader.load_sweep_config(master, ["seed=0"]) is not first  # composed afresh
    assert len(inner.calls) == 2


def test_a_batch_larger_than_the_store_composes_the_rest_again():
    inner, master = _Loader(), OmegaConf.create({})
    loader = ComposedOnce(inner)
    jobs = [[f"seed={k}"] for k in range(MAX_KEPT + 3)]
    launched = _validate_then_launch(loader, master, jobs)
    assert len(inner.calls) == len(jobs) + 3
    assert [cfg.overrides for cfg in launched] == jobs
