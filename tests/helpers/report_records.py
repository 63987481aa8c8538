"""Hand-written results.json records for the readers' tests."""

from __future__ import annotations

import json
from pathlib import Path


def record(method="dpsgd", eps=1.0, seed=0, acc=0.9, **extra):
    return {"method": method, "method_name": method, "dataset": "digits", "model": "mlp",
            "privacy": f"eps{eps:g}", "seed": seed, "target_epsilon": eps, "epsilon": eps * 0.99,
            "status": "completed", "metrics": {"accuracy": acc}, **extra}


def write_record_file(root: Path, name: str, content) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    text = content if isinstance(content, str) else json.dumps(content)
    (folder / "results.json").write_text(text)
    return folder
