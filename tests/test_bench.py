"""``dpbench-bench`` measures every dpbench mode and raw Opacus on the same model and batch."""

from __future__ import annotations

import math

import torch

from dpbench.bench import bench_model, main


def test_bench_rows_for_dpbench_modes_and_raw_opacus():
    r = bench_model("mlp", ["bk", "hooks"], ["hooks", "ghost"], 8, (1, 8, 8),
                    torch.device("cpu"), reps=2, warmup=1)
    assert set(r) == {"nonprivate", "dpbench bk", "dpbench hooks", "opacus hooks",
                      "opacus ghost"}
    assert all(math.isfinite(v) and v > 0 for v in r.values())


def test_bench_cli_prints_the_table(capsys):
    threads = torch.get_num_threads()
    try:
        code = main(["--models", "mlp", "--modes", "bk", "--batch-size", "8", "--reps", "1",
                     "--warmup", "1", "--threads", "1", "--clock", "cpu"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    out = capsys.readouterr().out
    assert "| mlp | dpbench bk | 8 |" in out and "| mlp | opacus ghost | 8 |" in out


def test_bench_text_model_has_a_prefix_cached_row():
    """MiniLM with LoRA on its top 2 layers: token-id batches, and the bk step on cached
    features of the frozen bottom 4 layers as its own row."""
    from dpbench.bench import CACHED

    r = bench_model("minilm_lora", ["bk"], [], 4, (16,), torch.device("cpu"), reps=1,
                    warmup=1)
    assert set(r) == {"nonprivate", "dpbench bk", CACHED}
    assert all(math.isfinite(v) and v > 0 for v in r.values())
