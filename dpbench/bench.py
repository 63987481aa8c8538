"""``dpbench-bench``: the cost of privacy per step, as ratios measured in one process.

For each model and grad-sample mode: the median time of one DP-SGD step (per-example
gradients, clipping, noise, update) divided by the median time of one non-private step
(mean-loss backward, update) on the same batch. Warm-up first, then repetitions that
alternate the two so drift (thermal, other load) hits both alike.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch

from dpbench.methods import get_method
from dpbench.methods.base import StepContext
from dpbench.models import get_model_builder
from dpbench.tasks import get_task
from dpbench.training.per_example import PerExampleGradients
from dpbench.training.step import private_release
from dpbench.utils.conf import GRAD_SAMPLE_MODES

#: model -> (input shape, batch size on CPU, batch size on CUDA)
DEFAULT_MODELS = {"mlp": ((1, 8, 8), 256, 1024), "cnn2": ((1, 28, 28), 256, 1024),
                  "resnet18": ((3, 32, 32), 16, 256)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench_model(name: str, mode: str, batch: int, shape, device: torch.device, reps: int,
                warmup: int) -> dict[str, float]:
    """Return median non-private and DP step times (s) and their ratio for one setting."""
    torch.manual_seed(0)
    base = get_model_builder(name)(shape, 10).to(device)
    model_np, model_dp = base, copy.deepcopy(base)
    task = get_task("classification")()
    x = torch.randn(batch, *shape, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    opt_np = torch.optim.SGD(model_np.parameters(), lr=1e-3)
    engine = PerExampleGradients(model_dp, mode)
    method = get_method("dpsgd")(optimizer=lambda p: torch.optim.SGD(p, lr=1e-3))
    method.params, method.optimizer = engine.params, torch.optim.SGD(engine.params, lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(0)
    ctx = StepContext(step=0, epoch=0, private=True, noise_multiplier=1.0, clip_norm=1.0,
                      expected_batch_size=float(batch), sample_rate=0.01, dataset_size=batch * 100,
                      total_steps=1, generator=gen)

    def step_np() -> None:
        task.per_example_loss(model_np, (x, y)).mean().backward()
        opt_np.step()
        opt_np.zero_grad(set_to_none=True)

    def step_dp() -> None:
        release = private_release(method, engine, task, (x, y), ctx, 1.0, None)
        method.update(release.grads, ctx)

    def timed(fn) -> float:
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        return time.perf_counter() - start

    for _ in range(warmup):
        step_np()
        step_dp()
    t_np, t_dp = [], []
    for r in range(reps):
        order = (step_np, step_dp) if r % 2 == 0 else (step_dp, step_np)
        for fn in order:
            (t_np if fn is step_np else t_dp).append(timed(fn))
    np_med, dp_med = statistics.median(t_np), statistics.median(t_dp)
    return {"nonprivate_s": np_med, "dp_s": dp_med, "ratio": dp_med / np_med}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dpbench-bench",
        description="Median DP-SGD step time / non-private step time per model and "
                    "grad-sample mode, measured in one process (warm-up, interleaved reps).")
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                        choices=list(DEFAULT_MODELS))
    parser.add_argument("--modes", nargs="+", default=list(GRAD_SAMPLE_MODES),
                        choices=list(GRAD_SAMPLE_MODES))
    parser.add_argument("--batch-size", type=int, default=None,
                        help="override the per-model default batch size")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("| model | mode | batch | non-private ms | DP ms | DP / non-private |")
    print("|---|---|---|---|---|---|")
    best: dict[str, float] = {}
    for name in args.models:
        shape, b_cpu, b_gpu = DEFAULT_MODELS[name]
        batch = args.batch_size or (b_gpu if device.type == "cuda" else b_cpu)
        reps = args.reps if name != "resnet18" or device.type == "cuda" else min(args.reps, 4)
        for mode in args.modes:
            try:
                r = bench_model(name, mode, batch, shape, device, reps, args.warmup)
            except Exception as err:  # a mode a model does not support
                print(f"| {name} | {mode} | {batch} | - | - | failed: {type(err).__name__} |")
                continue
            best[name] = min(best.get(name, float("inf")), r["ratio"])
            print(f"| {name} | {mode} | {batch} | {1e3 * r['nonprivate_s']:.1f} | "
                  f"{1e3 * r['dp_s']:.1f} | {r['ratio']:.2f}x |", flush=True)
    print("best mode per model: " + ", ".join(f"{k} {v:.2f}x" for k, v in best.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
