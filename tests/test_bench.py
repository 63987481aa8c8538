"""``dpbench-bench`` measures every dpbench mode and raw Opacus on the same model and batch."""

from __future__ import annotations

import math

import pytest
import torch

from dpbench.bench import main
from dpbench.bench_steps import bench_model

pytestmark = pytest.mark.integration  # whole runs: make test, not test-quick


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
    from dpbench.bench_presets import CACHED

    r = bench_model("minilm_lora", ["bk"], [], 4, (16,), torch.device("cpu"), reps=1,
                    warmup=1)
    assert set(r) == {"nonprivate", "dpbench bk", CACHED}
    assert all(math.isfinite(v) and v > 0 for v in r.values())


def test_rounds_report_the_median_of_per_round_ratios_and_their_range():
    """Ratios are formed within a round (same load) and summarised over rounds; a failed
    variant stays failed."""
    from dpbench.bench import summarise_rounds

    rounds = [{"nonprivate": 1.0, "dpbench bk": 1.5, "opacus ghost": 3.0},
              {"nonprivate": 2.0, "dpbench bk": 2.6, "opacus ghost": 4.0},
              {"nonprivate": 1.0, "dpbench bk": 1.4, "opacus ghost": 2.0}]
    out = summarise_rounds(rounds)
    assert out["dpbench bk"] == (1.5, "1.40x (1.30-1.50)", "0.65x (0.50-0.70)")
    assert out["opacus ghost"][1:] == ("2.00x (2.00-3.00)", "-")
    assert summarise_rounds([{"nonprivate": 1.0, "dpbench bk": float("nan")}])[
        "dpbench bk"][1] == "failed"
    assert summarise_rounds(rounds[:1])["dpbench bk"][1] == "1.50x"


@pytest.mark.parametrize("argv, key", [
    (["--reps", "0"], "--reps"), (["--rounds", "0"], "--rounds"), (["--threads", "0"], "--threads"),
    (["--warmup", "-1"], "--warmup"), (["--batch-size", "0"], "--batch-size"),
    (["--device", "nosuch"], "--device"), (["--device", "cuda"], "--device"),
    (["--seeds", "0"], "--seeds"), (["--seeds", "2", "--seeds-at-once", "0"], "--seeds-at-once"),
    (["--users", "0"], "--users"),
    (["--mia-references", "0"], "--mia-references"),
])
def test_bad_options_are_one_line_before_any_timing(argv, key, capsys):
    if argv == ["--device", "cuda"] and torch.cuda.is_available():
        argv = ["--device", "gpu"]  # a CUDA machine has cuda: a malformed name instead
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and key in captured.err
    assert "| model |" not in captured.out  # refused before the table (and any timing)


def test_bench_method_rows_time_two_point_methods_against_dp_adamw():
    """FIBER's CPU preset: DP-AdamW, DiSK and FIBER steps under bk (two points from the
    second step on, after the warm-up) in one process, with the non-private step."""
    from dpbench.bench_steps import bench_methods

    r = bench_methods("fiber_cpu", ["bk"], 4, torch.device("cpu"), reps=1, warmup=1)
    assert set(r) == {"nonprivate", "dpadamw bk", "disk bk", "fiber bk"}
    assert all(math.isfinite(v) and v > 0 for v in r.values())


def test_bench_method_rows_time_bandmf_against_dp_sgd():
    """BandMF's correlated noise (its noise shaper) against plain DP-SGD's step, on the
    MNIST CPU preset's model (the BandMF ratio a separate timing script used to take)."""
    from dpbench.bench_presets import METHOD_MODELS
    from dpbench.bench_steps import bench_methods

    assert METHOD_MODELS["bandmf_cpu"][-1] == ("dpsgd", "bandmf")
    r = bench_methods("bandmf_cpu", ["bk"], 4, torch.device("cpu"), reps=1, warmup=1)
    assert set(r) == {"nonprivate", "dpsgd bk", "bandmf bk"}
    assert all(math.isfinite(v) and v > 0 for v in r.values())


def test_bench_method_table_and_vit_rows(capsys):
    threads = torch.get_num_threads()
    try:
        code = main(["--models", "fiber_cpu", "vit_small", "--modes", "bk", "--opacus-modes",
                     "--batch-size", "2", "--reps", "1", "--warmup", "1", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    out = capsys.readouterr().out
    assert "| vit_small | dpbench bk | 2 |" in out
    assert "| fiber_cpu | fiber | bk | 2 |" in out and "/ dpadamw bk |" in out


def test_the_seeds_table_reports_seeds_per_cpu_minute_and_the_median_ratio(capsys):
    from dpbench.bench_seeds import print_seeds_table

    rounds = [{"cpu_1": 60.0, "wall_1": 70.0, "cpu_16": 20.0, "wall_16": 25.0},
              {"cpu_1": 64.0, "wall_1": 75.0, "cpu_16": 32.0, "wall_16": 40.0}]
    print_seeds_table(16, 16, rounds)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| demo")]
    assert len(rows) == 2
    assert "| 1 | 16 | 62.0 |" in rows[0] and "| 15.48 | 1.00x" in rows[0]
    # median CPU 26 s: 16 seeds * 60 / 26 = 36.92 per CPU-minute; 62 / 26 = 2.38x; per-round
    # ratios 3.00 and 2.00
    assert "| 16 | 16 | 26.0 |" in rows[1] and "| 36.92 | 2.38x (2.00-3.00) |" in rows[1]
    # an MIA cell's table counts models
    print_seeds_table(9, 9, [{"cpu_1": 30.0, "wall_1": 31.0, "cpu_9": 10.0, "wall_9": 11.0}],
                      cell="dpbench-mia demo, 1 target + 8 references", unit="models")
    out = capsys.readouterr().out
    assert "| models / CPU-minute |" in out
    assert ("| dpbench-mia demo, 1 target + 8 references | 9 | 9 | 10.0 | 11.0 | 54.00 | "
            "3.00x |") in out


def test_the_seeds_table_bounds_any_grouping_by_the_floor(capsys):
    """Rounds that timed the floor (the libraries a run imports, alone) add its row: alone /
    floor, the most any grouping of the cell could gain (median over rounds, their spread)."""
    from dpbench.bench_seeds import print_seeds_table

    rounds = [{"cpu_1": 60.0, "wall_1": 70.0, "cpu_16": 20.0, "wall_16": 25.0,
               "cpu_floor": 15.0, "wall_floor": 16.0},
              {"cpu_1": 64.0, "wall_1": 75.0, "cpu_16": 32.0, "wall_16": 40.0,
               "cpu_floor": 32.0, "wall_floor": 33.0}]
    print_seeds_table(16, 16, rounds)
    floor = [line for line in capsys.readouterr().out.splitlines() if "the floor" in line]
    # median floor CPU 23.5 s; per-round ceilings 60 / 15 = 4.00 and 64 / 32 = 2.00
    assert floor == ["| the floor: the libraries a run imports, nothing else | — | — | 23.5 | "
                     "24.5 | — | at most 3.00x (2.00-4.00) |"]


def test_the_users_table_times_per_user_steps_against_hooks_per_user(capsys):
    """``--users K``: each mode clips users of K rows (engine.clipped_user_sum), a row per
    mode with its ratio to the non-private step and to hooks per user."""
    from dpbench.bench_steps import bench_users

    r = bench_users("mlp", ["hooks", "bk", "ghost"], 10, (1, 8, 8), 4, torch.device("cpu"),
                    reps=1, warmup=1)
    assert set(r) == {"nonprivate", "hooks per user", "bk per user", "ghost per user"}
    assert all(math.isfinite(v) and v > 0 for v in r.values())
    threads = torch.get_num_threads()
    try:
        assert main(["--models", "mlp", "--modes", "bk", "--users", "4", "--batch-size", "8",
                     "--reps", "1", "--warmup", "0", "--rounds", "1", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "| mlp | bk per user | 8 (2 users of 4) |" in out
    assert "| mlp | hooks per user | 8 (2 users of 4) |" in out and "1.00x |" in out
