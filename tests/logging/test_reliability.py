"""The reliability diagram callback writes a PNG for classification runs only."""

from __future__ import annotations

import torch

from dpbench.logging.reliability import DIAGRAM_NAME, ReliabilityDiagram
from dpbench.tasks.calibration import calibration_metrics


def test_reliability_diagram_png_is_written(tmp_path):
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.82, 0.08], [0.3, 0.3, 0.4]])
    metrics = calibration_metrics(probs.log(), torch.tensor([0, 1, 0]))
    ReliabilityDiagram(tmp_path, "test").on_run_end(None, {"metrics": metrics})
    png = (tmp_path / DIAGRAM_NAME).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    ReliabilityDiagram(tmp_path / "none").on_run_end(None, {"metrics": {"rmse": 1.0}})
    assert not (tmp_path / "none").exists()
