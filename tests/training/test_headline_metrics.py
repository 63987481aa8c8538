"""Headline ``metrics`` derive from test data and released quantities only.

With the update switched off the releases move nothing, so the model, and every metric
computed from it on the test data, must be the same whatever the training data hold. A key
of ``metrics`` that changes with the training data was computed on it without noise: such
diagnostics belong under ``unprivatised_diagnostics``.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from tests.helpers.config import compose_config
from tests.helpers.wrapped import build_wrapped, never_applied

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick


def _sine_csv(path):
    t = np.arange(400)
    pd.DataFrame({"date": pd.date_range("2021-01-01", periods=len(t), freq="h"),
                  "a": np.sin(2 * np.pi * t / 24), "b": np.cos(2 * np.pi * t / 24)}
                 ).to_csv(path, index=False)
    return path


def _json(value) -> str:
    return json.dumps(value, sort_keys=True)


def _run(overrides, scale: float) -> dict:
    # released, accounted, never applied
    trainer = build_wrapped(compose_config(*overrides), update=never_applied)
    test_before = [t.clone() for t in trainer.data.test.tensors]
    with torch.no_grad():
        trainer.data.train.tensors[0].mul_(scale)  # other training data, same test data
    assert all(torch.equal(a, b) for a, b in zip(test_before, trainer.data.test.tensors))
    return trainer.fit()


CASES = {
    "classification": ["method=dpsgd", "model.hidden=16", "trainer.batch_size=64"],
    "ts_diffusion": ["dataset=csv_timeseries", "method=dp_adaln", "model=dit", "model.hidden=8",
                     "model.depth=1", "dataset.window=8", "dataset.test_stride=8",
                     "trainer.batch_size=16", "+task.diffusion_steps=8",
                     "+task.num_samples=3"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_metric_changes_with_the_training_data_when_nothing_is_learnt(case, tmp_path):
    overrides = [*CASES[case], "trainer.epochs=1", "trainer.checkpoint=false",
                 "privacy=sigma", "privacy.noise_multiplier=1.0"]
    if case == "ts_diffusion":
        overrides.append(f"dataset.path={_sine_csv(tmp_path / 'sine.csv')}")
    a, b = _run(overrides, 1.0), _run(overrides, 3.0)
    assert a["metrics"].keys() == b["metrics"].keys() and a["metrics"]
    for key in a["metrics"]:  # as JSON: NaN equals NaN
        assert _json(a["metrics"][key]) == _json(b["metrics"][key]), \
            f"metrics[{key!r}] reads the training data"
    assert _json(a["history"]) == _json(b["history"])
    assert _json(a["step_history"]) == _json(b["step_history"])
    diag = a["unprivatised_diagnostics"]
    assert "NOT PRIVATISED" in diag["note"]
    if case == "ts_diffusion":  # the diagnostics do read the training data: they moved out
        other = b["unprivatised_diagnostics"]["final"]
        assert diag["final"]["g_total_norms"] != other["g_total_norms"]
