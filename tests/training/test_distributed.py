"""K processes train the run one process trains (torchrun, gloo, CPU).

One global Poisson mask per step, each rank its slice; the clipped sums all-reduced; the
noise added once, by rank 0, from the run's noise stream. So a 2-rank run has the 1-process
run's batches, epsilon and ledger, draws the same noise, and ends with the same parameters up
to the order of float32 summation.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from opacus.utils.uniform_sampler import UniformWithReplacementSampler

from dpbench.experiment import build_trainer
from dpbench.training.checkpoint import load_checkpoint
from dpbench.training.distributed import Collective, ShardedBatchSampler
from tests.helpers.config import QUIET, compose_config
from tests.helpers.distributed import torchrun_command as _torchrun
from tests.helpers.distributed import torchrun_env as _env

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

REPO = Path(__file__).resolve().parents[2]
RUN = ["dataset=digits", "model=mlp", "trainer.epochs=3", "trainer.batch_size=64",
       "trainer.num_threads=1", *QUIET]
EPS = torch.finfo(torch.float32).eps


@pytest.mark.parametrize("world", [2, 3])
def test_the_ranks_slices_partition_the_one_global_mask(world):
    def batches(generator_seed: int, sampler_cls=UniformWithReplacementSampler):
        g = torch.Generator().manual_seed(generator_seed)
        return sampler_cls(num_samples=500, sample_rate=0.006, generator=g, steps=40)

    one = list(batches(7))
    slices = [list(ShardedBatchSampler(batches(7), Collective(rank=r, world_size=world)))
              for r in range(world)]
    assert all(len(s) == len(one) for s in slices)  # every rank steps every time
    assert any(len(s[t]) == 0 for s in slices for t in range(len(one)))  # empty slices occur
    for t, batch in enumerate(one):
        parts = [s[t] for s in slices]
        assert sorted(i for p in parts for i in p) == sorted(batch)  # the one global mask
        assert sum(len(p) for p in parts) == len(set(i for p in parts for i in p))  # disjoint


@pytest.mark.processes  # torchrun's processes: make test-processes
@pytest.mark.parametrize("extra", [
    ["method=dpsgd", "trainer.grad_sample_mode=bk"],
    ["method=dpsgd", "trainer.grad_sample_mode=hooks"],
    ["method=adaclip", "trainer.grad_sample_mode=bk"],  # an extra query (the clipped count)
], ids=["dpsgd-bk", "dpsgd-hooks", "adaclip-bk"])
def test_two_ranks_equal_one_process(tmp_path, extra):
    overrides = [*RUN, *extra]
    two = tmp_path / "two"
    proc = subprocess.run(_torchrun(overrides, two), capture_output=True, text=True,
                          timeout=300, env=_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads((two / "results.json").read_text())
    trainer = build_trainer(compose_config(*overrides), tmp_path / "one")
    ref = trainer.fit()
    assert got["world_size"] == 2 and got["devices"] == ["cpu", "cpu"]
    assert got["status"] == "completed" and got["steps"] == ref["steps"]
    assert got["epsilon"] == ref["epsilon"]  # one accountant, the same steps
    assert got["privacy_ledger"] == ref["privacy_ledger"]
    assert got["engine_check"]["engine"] == ref["engine_check"]["engine"]
    two_ck = load_checkpoint(two / "checkpoint.pt")
    one_ck = load_checkpoint(tmp_path / "one" / "checkpoint.pt")
    # the same global masks (sampler stream) and the same noise draws (noise stream, rank 0)
    for stream in ("sampler", "noise", "method"):
        assert torch.equal(two_ck["generators"][stream], one_ck["generators"][stream]), stream
    # parameters: the same up to float32 summation order, over every step of the run
    steps = ref["steps"]
    for name, value in one_ck["model"].items():
        scale = float(value.abs().max()) + 1.0
        diff = float((two_ck["model"][name] - value).abs().max())
        assert diff <= 64 * steps * EPS * scale, (name, diff)
    assert got["metrics"]["accuracy"] == pytest.approx(ref["metrics"]["accuracy"], abs=2e-3)


@pytest.mark.processes  # torchrun's processes: make test-processes
def test_a_rank_that_dies_stops_every_rank_in_one_line_and_the_run_resumes(tmp_path):
    run_dir = tmp_path / "run"
    # four epochs left after the first checkpoint: the kill lands mid-run
    overrides = [*RUN, "trainer.epochs=5", "trainer.batch_size=32"]
    proc = subprocess.Popen(_torchrun(overrides, run_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    try:
        deadline = time.time() + 600
        victim = None
        while time.time() < deadline and victim is None:
            if (run_dir / "checkpoint.pt").exists():  # the first epoch is done
                for child in psutil.Process(proc.pid).children(recursive=True):
                    try:
                        if child.environ().get("RANK") == "1":
                            victim = child
                    except psutil.Error:
                        pass
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.02)
        assert victim is not None, "the run did not start training"
        victim.kill()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    lines = [line for line in err.splitlines() if line.startswith("dpbench: error:")]
    assert lines and any("lost contact with another rank" in line for line in lines), err[-2000:]
    record = json.loads((run_dir / "results.json").read_text())  # complete, never half-written
    assert record["status"] != "completed"
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    stopped = load_checkpoint(run_dir / "checkpoint.pt")["step"]  # the last one is intact
    # resumed under the same K: every rank starts from rank 0's checkpoint, one accountant
    resumed = subprocess.run(_torchrun([*overrides, "trainer.resume=true"], run_dir),
                             capture_output=True, text=True, timeout=600, env=_env(),
                             cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = json.loads((run_dir / "results.json").read_text())
    ref = build_trainer(compose_config(*overrides), tmp_path / "one").fit()
    assert 0 < stopped < got["steps"] == ref["steps"]
    assert got["epsilon"] == ref["epsilon"] and got["privacy_ledger"] == ref["privacy_ledger"]
    assert [c["when"] for c in got["engine_check"]["checks"]] == ["start", "resume"]
    two = load_checkpoint(run_dir / "checkpoint.pt")
    one = load_checkpoint(tmp_path / "one" / "checkpoint.pt")
    for stream in ("sampler", "noise"):
        assert torch.equal(two["generators"][stream], one["generators"][stream]), stream
    for name, value in one["model"].items():
        diff = float((two["model"][name] - value).abs().max())
        assert diff <= 64 * ref["steps"] * EPS * (float(value.abs().max()) + 1.0), name


@pytest.mark.processes  # torchrun's processes: make test-processes
def test_torchrun_refuses_a_sweep_in_one_line(tmp_path):
    proc = subprocess.run(_torchrun(["-m", *RUN, "seed=0,1"], tmp_path / "x"),
                          capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path)
    assert proc.returncode != 0
    assert "dpbench: error: torchrun trains one run" in proc.stderr
    assert not (tmp_path / "x").exists()
