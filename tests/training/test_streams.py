"""Every random stream has its own seed spawned from the run's seed; no two streams alias."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from dpbench.errors import ConfigError
from dpbench.experiment import build_trainer
from tests.helpers.config import compose_config

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

RUN = ("model.hidden=16", "trainer.batch_size=64", "trainer.epochs=1",
       "trainer.checkpoint=false")


def test_stream_seeds_are_pairwise_distinct_and_spawned_by_seed_sequence():
    from dpbench.utils.seeding import STREAMS, stream_seed

    seeds = {(s, name, i): stream_seed(s, name, i) for s in (0, 1, 2, 7)
             for name in STREAMS for i in range(3)}
    assert len(set(seeds.values())) == len(seeds)
    expected = np.random.SeedSequence(3, spawn_key=(STREAMS.index("noise"),))
    assert stream_seed(3, "noise") == int(expected.generate_state(1, np.uint64)[0] >> 1)
    assert np.random.SeedSequence(3).spawn(len(STREAMS))[STREAMS.index("noise")].spawn_key \
        == expected.spawn_key  # the name-th child of SeedSequence(seed).spawn
    with pytest.raises(ValueError, match="unknown random stream"):
        stream_seed(0, "nosuch")
    with pytest.raises(ConfigError, match="seed must be an integer >= 0"):
        stream_seed(-1, "noise")


def _draws(generator: torch.Generator, n: int = 20000) -> torch.Tensor:
    copy = torch.Generator(device=generator.device)
    copy.set_state(generator.get_state())  # the stream's next draws, without consuming them
    return torch.rand(n, generator=copy, device=generator.device).cpu().double()


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


def test_the_loops_streams_never_share_a_seed_and_are_uncorrelated():
    trainer = build_trainer(compose_config(*RUN, "method=dp_ivon"), None)
    ctx = trainer._context()
    assert not any(isinstance(v, torch.Generator) and v is trainer.noise_generator
                   for v in vars(ctx).values())  # the method's context never holds the noise
    gens = {"sampler": trainer.sampler_generator, "noise": trainer.noise_generator,
            # posterior samples and per-example draws: streams of their own
            "method": ctx.method_generator,
            "task": getattr(trainer.task, "generator", None) or torch.default_generator}
    seeds = {name: g.initial_seed() for name, g in gens.items()}
    seeds["global"] = torch.initial_seed()  # what dropout and unseeded draws use
    assert len(set(seeds.values())) == len(seeds), seeds
    for (a, ga), (b, gb) in itertools.combinations(gens.items(), 2):
        assert abs(_correlation(_draws(ga), _draws(gb))) < 0.05, (a, b)


def test_audit_canaries_and_secrets_do_not_alias_the_training_streams():
    from dpbench.audit.canaries import AuditSettings, CanaryRun

    cfg = compose_config(*RUN)  # seed 0 and audit.seed 0: the case that used to alias
    audit = AuditSettings(canaries=400, guesses_included=5, guesses_excluded=5, seed=0)
    run = CanaryRun(audit)
    trainer = build_trainer(cfg, None, make_trainer=run)
    canaries = run.canaries
    gens = {"sampler": trainer.sampler_generator, "noise": trainer.noise_generator,
            "canaries": canaries.sampler}
    seeds = [g.initial_seed() for g in gens.values()]
    assert len(set(seeds)) == len(seeds)
    for (a, ga), (b, gb) in itertools.combinations(gens.items(), 2):
        assert abs(_correlation(_draws(ga), _draws(gb))) < 0.05, (a, b)
    for g in gens.values():  # the secrets S_i are no function of another stream's draws
        fresh = torch.Generator().manual_seed(g.initial_seed())
        agree = float(((torch.rand(400, generator=fresh) < 0.5) == canaries.included)
                      .double().mean())
        assert 0.4 < agree < 0.6, agree
    assert trainer.generators["audit_canaries"] is canaries.sampler  # checkpointed
    assert "audit_canaries" in trainer.state_dict()["generators"]


def test_diffusion_draws_come_from_the_task_stream_not_the_global_rng(tmp_path):
    import pandas as pd

    n = 200
    t = np.arange(n)
    pd.DataFrame({"date": pd.date_range("2021-01-01", periods=n, freq="h"),
                  "a": np.sin(t / 4)}).to_csv(tmp_path / "s.csv", index=False)
    cfg = compose_config("dataset=csv_timeseries", f"dataset.path={tmp_path / 's.csv'}",
                         "dataset.window=8", "model=dit", "model.hidden=8", "model.depth=1",
                         "method=dp_adaln", "trainer.batch_size=16", "trainer.epochs=1",
                         "trainer.checkpoint=false")
    trainer = build_trainer(cfg, None)
    assert trainer.task.generator is trainer.generators["task"]
    batch = tuple(x[:6] for x in trainer.data.train.tensors)
    global_state = torch.get_rng_state()
    task_state = trainer.task.generator.get_state()
    trainer.task._draws(batch)
    assert torch.equal(torch.get_rng_state(), global_state)  # the global RNG is untouched
    assert not torch.equal(trainer.task.generator.get_state(), task_state)
