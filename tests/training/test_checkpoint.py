"""Checkpoints: loaded without running code, damaged files named as such, RNG state exact."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dpbench.cli import hydra_main
from dpbench.training.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointError,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    to_plain,
)
from dpbench.utils.mac import write_mac
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick

RUN = ("method=dpsgd", "dataset=digits", "model=logreg", "trainer.epochs=1",
       "trainer.batch_size=256", "privacy=sigma", "privacy.noise_multiplier=1.0")


class _Payload:
    """Unpickling this calls open(marker, "w"): a stand-in for arbitrary code."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _resume(run_dir, monkeypatch) -> int:
    return run_cli(hydra_main, [*RUN, "trainer.resume=true", f"hydra.run.dir={run_dir}"],
                   monkeypatch)


def test_a_pickle_payload_in_the_checkpoint_does_not_run(tmp_path, monkeypatch, capfd):
    run_dir, marker = tmp_path / "run", tmp_path / "payload-ran"
    run_dir.mkdir()
    path = run_dir / CHECKPOINT_NAME
    torch.save({"fingerprint": "x", "model": _Payload(marker)}, path)
    assert _resume(run_dir, monkeypatch) == 2  # planted: no MAC, refused unparsed
    err = capfd.readouterr().err.strip()
    assert not marker.exists()
    assert len(err.splitlines()) == 1 and "has no MAC" in err and "start afresh" in err
    assert sorted(p.name for p in run_dir.iterdir()) == [CHECKPOINT_NAME]  # nothing written
    write_mac(path, path.read_bytes())  # even one with this user's MAC is parsed code-free
    assert _resume(run_dir, monkeypatch) == 2
    err = capfd.readouterr().err.strip()
    assert not marker.exists()
    assert len(err.splitlines()) == 1 and "refusing to load" in err and "allow-list" in err


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_damaged_checkpoint_says_so_in_one_line(tmp_path, monkeypatch, capfd, damage):
    path = tmp_path / "run" / CHECKPOINT_NAME  # an interrupted run: only its checkpoint
    save_checkpoint(path, {"fingerprint": "x", "model": {"w": torch.randn(64, 64)},
                           "rng": rng_state()})
    raw = path.read_bytes()
    path.write_bytes({"truncated": raw[: len(raw) // 2], "garbage": b"not a checkpoint" * 8,
                      "empty": b""}[damage])
    assert _resume(path.parent, monkeypatch) == 2  # the MAC no longer matches
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "MAC does not match" in err, err
    write_mac(path, path.read_bytes())  # damaged before it was authenticated: still named
    assert _resume(path.parent, monkeypatch) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "corrupt or truncated" in err, err
    assert "Traceback" not in err


def test_checkpoint_round_trip_restores_every_rng_exactly(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.standard_normal()  # leaves a cached Gaussian in NumPy's legacy state
    save_checkpoint(tmp_path / "c.pt", {"rng": rng_state(), "score": np.float64(0.25),
                                        "rows": [{"step": np.int64(3)}]})
    expected = (random.random(), np.random.standard_normal(4), torch.rand(4))
    state = load_checkpoint(tmp_path / "c.pt")
    assert state["score"] == 0.25 and state["rows"] == [{"step": 3}]
    set_rng_state(state["rng"])
    again = (random.random(), np.random.standard_normal(4), torch.rand(4))
    assert again[0] == expected[0]
    assert np.array_equal(again[1], expected[1]) and torch.equal(again[2], expected[2])


def test_saving_an_object_that_cannot_be_loaded_safely_fails_at_save(tmp_path):
    with pytest.raises(TypeError, match=r"state\.method\.extra\.f"):
        to_plain({"method": {"extra": {"f": lambda: 0}}})
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path / "c.pt", {"x": object()})
    assert not (tmp_path / "c.pt").exists()


def test_a_file_that_is_not_readable_is_not_called_corrupt(tmp_path, monkeypatch):
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(path, {"a": 1})

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    # the bytes are read first (a regular file of bounded size), then loaded from memory
    monkeypatch.setattr("dpbench.training.checkpoint.read_bytes", denied)
    with pytest.raises(CheckpointError, match="cannot read") as info:
        load_checkpoint(path)
    assert "corrupt" not in str(info.value)
