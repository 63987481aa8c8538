"""A dpbench-mia run's values and ROC to Weights & Biases (when ``logger`` names the W&B sink).

The same numbers as results.json: the target's accuracy and accounted epsilon, every
attack's metrics and intervals (``mia/<attack>/<metric>``) in the run summary, the ROC as a
table (``mia/roc``: attack, fpr, tpr) and as the log-log image. Offline by default, like
training runs (``conf/logger/wandb.yaml``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

#: the logger the values go to (``conf/logger/wandb.yaml`` and ``wandb_online.yaml``)
WANDB_TARGET = "dpbench.logging.wandb_sink.WandbSink"


def wandb_values(record: dict[str, Any]) -> dict[str, float]:
    """Return the summary values of a dpbench-mia record (numbers only)."""
    out: dict[str, float] = {"epsilon": record.get("epsilon"),
                             "target_epsilon": record.get("target_epsilon"),
                             **{k: v for k, v in (record.get("metrics") or {}).items()}}
    for attack, metrics in record["mia"]["attacks"].items():
        for key, value in metrics.items():
            if key == "epsilon":
                out.update({f"mia/{attack}/{k if k.startswith('epsilon') else 'epsilon_' + k}":
                            v for k, v in value.items()})
            else:
                out[f"mia/{attack}/{key}"] = value
    return {k: float(v) for k, v in out.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def log_to_wandb(cfg: DictConfig, record: dict[str, Any],
                 curves: dict[str, tuple[np.ndarray, np.ndarray]], run_dir: Path,
                 group: str | None) -> bool:
    """Log the run to W&B if ``cfg.logger`` is the W&B sink; return whether it did."""
    logger = cfg.get("logger")
    if logger is None or logger.get("_target_") != WANDB_TARGET:
        return False
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    run = wandb.init(mode=logger.get("mode", "offline"), project=logger.get("project"),
                     entity=logger.get("entity"), group=logger.get("group") or group,
                     name=cfg.get("run_name"), dir=str(run_dir), reinit="finish_previous",
                     config=OmegaConf.to_container(cfg, resolve=True))
    for key, value in wandb_values(record).items():
        run.summary[key] = value
    rows = [[attack, float(f), float(t)] for attack, (fpr, tpr) in curves.items()
            for f, t in zip(fpr, tpr)]
    logged: dict[str, Any] = {"mia/roc": wandb.Table(columns=["attack", "fpr", "tpr"],
                                                     data=rows)}
    if (run_dir / "roc.png").is_file():
        logged["mia/roc_plot"] = wandb.Image(str(run_dir / "roc.png"))
    run.log(logged)
    run.finish()
    return True
