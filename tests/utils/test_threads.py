"""Threads per job: k parallel sweep jobs share the cores; a user's thread count wins."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from dpbench.utils.threads import apply_threads, parallel_jobs, threads_per_job

JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
BASIC = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def test_parallel_jobs_follows_joblib_semantics():
    assert parallel_jobs(2, 16) == 2
    assert parallel_jobs(-1, 16) == 16  # all cores
    assert parallel_jobs(-2, 16) == 15  # all but one
    assert parallel_jobs(-40, 4) == 1


def test_threads_per_job_shares_cores_unless_the_user_chose():
    assert threads_per_job(None, 2, 2, env={}) == 1
    assert threads_per_job(None, 3, 16, env={}) == 5
    assert threads_per_job(None, 32, 16, env={}) == 1  # never 0
    assert threads_per_job(None, 1, 16, env={}) is None  # sequential: torch's default
    assert threads_per_job(4, 2, 2, env={}) == 4  # trainer.num_threads wins
    assert threads_per_job(None, 2, 16, env={"OMP_NUM_THREADS": "3"}) is None  # env wins


def test_apply_threads_sets_torch_for_a_joblib_job(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("dpbench.utils.threads.available_cores", lambda: 8)
    before = torch.get_num_threads()
    try:
        assert apply_threads(None, OmegaConf.create(
            {"launcher": {"_target_": JOBLIB, "n_jobs": 4}})) == 2
        assert torch.get_num_threads() == 2
        assert apply_threads(None, OmegaConf.create({"launcher": {"_target_": BASIC}})) is None
        assert torch.get_num_threads() == 2  # untouched
        assert apply_threads(3, OmegaConf.create({"launcher": {"_target_": BASIC}})) == 3
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
