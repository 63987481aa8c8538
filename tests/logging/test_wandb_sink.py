"""The W&B sink logs released values per step; un-privatised diagnostics only on request."""

from __future__ import annotations

from types import SimpleNamespace

from dpbench.logging.wandb_sink import WandbSink

STEP = {"step": 3, "clip_threshold": 0.7,
        "unprivatised": {"loss": 0.4, "batch_size": 31, "grad_norm_p50": 1.2}}


class _Run:
    def __init__(self) -> None:
        self.logged: list[dict] = []

    def log(self, values: dict, step: int) -> None:
        self.logged.append(values)


def _logged(private_diagnostics: bool, **option: bool) -> dict:
    sink = WandbSink(private_diagnostics=private_diagnostics, **option)
    sink.run = _Run()
    sink.on_step_end(SimpleNamespace(step=3), STEP)
    return sink.run.logged[0]


def test_training_diagnostics_stay_out_of_wandb_by_default():
    logged = _logged(False)
    assert logged == {"train/step": 3, "train/clip_threshold": 0.7}


def test_private_diagnostics_are_logged_apart_when_asked():
    logged = _logged(True)
    assert logged["unprivatised/loss"] == 0.4 and logged["unprivatised/batch_size"] == 31
    assert not any(k.startswith("train/") and "loss" in k for k in logged)


def test_the_option_reads_under_its_new_name_and_the_old_one():
    """``unprivatised_diagnostics`` (the results.json key's new name) and the older
    ``private_diagnostics`` both switch the diagnostics on; the new name wins over the old."""
    assert "unprivatised/loss" in _logged(False, unprivatised_diagnostics=True)
    assert "unprivatised/loss" not in _logged(True, unprivatised_diagnostics=False)
    assert "unprivatised/loss" in _logged(True)
