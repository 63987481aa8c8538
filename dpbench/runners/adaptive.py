"""``dpbench-reproduce --until-decided``: a paper's claims decided by the planned two-stage
design of ``dpbench.analysis.design`` (docs/tuning-and-claims.md, "The design").

1. The design is declared before any run: ``design.json`` beside the paper's runs records
   the pilot's seeds, the pilot's share of alpha and the stage weights.
2. The pilot runs (``--pilot`` seeds a cell; default ``default_pilot``: 5, or 10 for a
   paper with a one-sided claim of several cells); the claims are evaluated at the
   pilot's look.
3. Each undecided claim's follow-up is sized by its hint (80 % assurance at the claimed
   effect, at its conditional level given the pilot). Claims are taken cheapest first while
   the budget (``--budget`` runs, ``--budget-minutes``, the pilot's runs included, minutes
   from the pilot's pace) holds; a claim whose follow-up is out of reach stops for futility
   (non-binding: no error rate rises). The follow-up's seeds are recorded in
   ``design.json`` before they run; a third look is refused.
4. The follow-up runs; the claims are decided at the combined look.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpbench.analysis.claim_spec import expand_cells
from dpbench.analysis.design import (
    PILOT_SEEDS,
    PILOT_SHARE,
    STAGE1_WEIGHT,
    Stages,
    pilot_seeds,
)
from dpbench.utils.io import atomic_write_json
from dpbench.utils.safe_json import UnsafeFile, read_json

DESIGN_NAME = "design.json"
__all__ = ["PILOT_SEEDS", "DesignError", "declare", "default_pilot", "load_design", "load_stages",
           "plan_follow_up", "plan_notes", "until_decided"]


class DesignError(ValueError):
    """A request that the recorded design does not allow (one line)."""


def load_design(out: Path) -> dict[str, Any] | None:
    """Return the paper's recorded design (``design.json``), None if there is none."""
    path = out / DESIGN_NAME
    if not path.is_file() or path.is_symlink():
        return None
    try:  # bounded: a FIFO or a huge file is refused, never waited on
        record = read_json(path, max_bytes=1 << 20)
    except (UnsafeFile, OSError) as err:
        raise DesignError(f"{path}: {err}; move it away") from None
    if not isinstance(record, dict):
        raise DesignError(f"{path}: not a design record (not a JSON object)")
    for key in ("pilot", "follow_up"):
        seeds = record.get(key, [])
        if not isinstance(seeds, list) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
            raise DesignError(f"{path}: {key} must be a list of seeds (integers >= 0)")
    if not record.get("pilot"):
        raise DesignError(f"{path}: not a design record (no 'pilot' seeds)")
    return record


def load_stages(out: Path) -> Stages | None:
    """Return the stages of the paper's recorded design, None without one (a fixed look)."""
    record = load_design(out)
    if record is None:
        return None
    return Stages(tuple(int(s) for s in record["pilot"]),
                  tuple(int(s) for s in record.get("follow_up", [])))


def declare(out: Path, pilot: list[int], follow_up: list[int] | None = None,
            plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record the design (the pilot's seeds, once), or its follow-up's seeds (once: a later
    request within the recorded follow-up resumes it; one beyond it is a third look,
    refused with DesignError before anything runs)."""
    record = load_design(out)
    if record is None:
        record = {"pilot": sorted(pilot), "follow_up": [], "pilot_share": PILOT_SHARE,
                  "stage1_weight": STAGE1_WEIGHT,
                  "declared": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    elif not set(pilot) <= set(record["pilot"]) | set(record.get("follow_up", [])):
        raise DesignError(f"the design's pilot is seeds {_seeds(record['pilot'])}; seeds "
                          f"{_seeds(sorted(set(pilot) - set(record['pilot'])))} are neither "
                          f"its pilot nor its follow-up (remove {out / DESIGN_NAME} to start "
                          "a new design on new runs)")
    extra = sorted(set(follow_up or []) - set(record["pilot"]))
    if extra:
        recorded = record.get("follow_up", [])
        if recorded and not set(extra) <= set(recorded):
            raise DesignError(f"the design's follow-up (seeds {_seeds(recorded)}) is recorded; "
                              f"seeds {_seeds(sorted(set(extra) - set(recorded)))} would be "
                              "a third look, which the design does not allow")
        if not recorded:
            record["follow_up"] = extra
            record["follow_up_declared"] = time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                         time.gmtime())
            if plan is not None:
                record["plan"] = plan
    atomic_write_json(out / DESIGN_NAME, record)
    return record


def default_pilot(spec: dict[str, Any]) -> int:
    """Return the design's pilot, seeds a cell, for a paper's spec (``design.pilot_seeds``):
    more when a one-sided claim (any kind but equivalence) spans several cells."""
    return pilot_seeds(any(claim.get("kind") != "equivalence"
                           and len(expand_cells(claim.get("where") or {})) > 1
                           for claim in spec.get("claims", [])))


def _seeds(seeds: list[int]) -> str:
    return ",".join(map(str, seeds)) or "none"


def plan_follow_up(rows: list[dict[str, Any]], sweeps_of: dict[str, list[str]],
                   runs_per_seed: dict[str, float], pilot_n: int,
                   budget_runs: float | None) -> tuple[dict[str, int], dict[str, dict]]:
    """Return (the seeds each claim's sweeps are raised to, each claim's plan): the
    undecided claims with a finite hint, cheapest follow-up first, while the runs of the
    follow-ups (sweeps shared by claims counted once, at the largest follow-up) fit
    ``budget_runs``; the others stop (decided at the pilot, or for futility)."""
    plan: dict[str, dict] = {}
    wanted = []
    for row in rows:
        cid = row.get("id")
        if not cid:
            continue
        if row["verdict"] != "underpowered":
            plan[cid] = {"status": "decided at the pilot" if row["verdict"] not in (
                "not run", "failed runs") else row["verdict"]}
        elif isinstance(row.get("seeds_follow_up"), int):
            wanted.append((cid, int(row["seeds_follow_up"])))
        else:
            plan[cid] = {"status": "futile",
                         "why": f"the hint is {row.get('seeds_follow_up')}"}

    def cost(extra: dict[str, int]) -> float:
        return sum(runs_per_seed.get(s, 0.0) * n for s, n in extra.items())

    raised: dict[str, int] = {}
    chosen: dict[str, int] = {}
    for cid, n2 in sorted(wanted, key=lambda w: cost({s: w[1] for s in sweeps_of[w[0]]})):
        trial = dict(raised)
        for s in sweeps_of[cid]:
            trial[s] = max(trial.get(s, 0), n2)
        if budget_runs is not None and cost(trial) > budget_runs + 1e-9:
            need = math.ceil(cost({s: n2 for s in sweeps_of[cid]}))
            left = max(0, math.floor(budget_runs - cost(raised)))
            plan[cid] = {"status": "futile", "follow_up": n2,
                         "why": f"a follow-up of {n2} seeds a cell needs {need} runs; the "
                                f"budget leaves {left}"}
            continue
        raised, chosen[cid] = trial, n2
        plan[cid] = {"status": "followed up", "follow_up": n2}
    return {cid: pilot_n + n2 for cid, n2 in chosen.items()}, plan


@dataclass(frozen=True)
class Runner:
    """What the design needs of ``dpbench-reproduce``: its sweep commands, their run
    counts, running them, and the paper's claims."""

    sweep_commands: Callable[..., list[dict]]
    job_runs: Callable[[dict], int]
    run_jobs: Callable[..., None]
    paper_claims: Callable[..., list[dict[str, Any]]]


def until_decided(paper: str, spec: dict[str, Any], args: argparse.Namespace, out: Path,
                  progress: Any, rp: Runner) -> None:
    """Run the paper's design: the pilot, the look, the follow-up sized by the hints within
    the budget, and the combined look (the claims table reads ``design.json``)."""
    from dpbench.analysis.claims import adjust

    start = time.perf_counter()
    record = load_design(out)
    design_pilot = default_pilot(spec)
    size = design_pilot if args.pilot is None else args.pilot
    if not args.seeds and size < design_pilot:
        print(f"dpbench-reproduce: {paper}: note: a pilot of {size} seeds, under the "
              f"design's {design_pilot} for claims of several cells: their hints "
              "deliver less power than they state when one cell's SD dominates "
              "(docs/tuning-and-claims.md, \"Seeds needed\")", flush=True)
    pilot = [int(s) for s in (args.seeds.split(",") if args.seeds else range(size))]
    if record is not None:
        pilot = [int(s) for s in record["pilot"]]
    pilot_args = argparse.Namespace(**{**vars(args), "seeds": ",".join(map(str, pilot)),
                                       "claim_seeds": {}})
    pilot_jobs = rp.sweep_commands(spec, pilot_args, out)
    pilot_runs = sum(rp.job_runs(j) for j in pilot_jobs)
    if args.budget is not None and pilot_runs > args.budget:
        raise DesignError(f"{paper}: the pilot alone is {pilot_runs} runs, over --budget "
                          f"{args.budget} (lower --pilot or raise the budget)")
    declare(out, pilot)
    print(f"dpbench-reproduce: {paper}: stage 1, the pilot: {len(pilot)} seeds a cell, "
          f"{pilot_runs} runs", flush=True)
    rp.run_jobs(pilot_jobs, dry_run=False, progress=progress, label=f"{paper}/pilot/")
    elapsed = time.perf_counter() - start
    rows = adjust(rp.paper_claims(paper, spec, out))
    runs_per_seed = {j["folder"].name: rp.job_runs(j) / len(pilot) for j in pilot_jobs}
    budget = _budget_runs(args, pilot_runs, elapsed)
    sweeps_of = {c["id"]: _claim_sweep_names(spec, c) for c in spec.get("claims", [])
                 if c.get("id")}
    raised, plan = plan_follow_up(rows, sweeps_of, runs_per_seed, len(pilot), budget)
    if not raised:
        print(f"dpbench-reproduce: {paper}: no follow-up ({_plan_text(plan)})", flush=True)
        return
    follow_args = argparse.Namespace(**{**vars(args), "seeds": ",".join(map(str, pilot)),
                                        "claim_seeds": raised})
    follow_jobs = rp.sweep_commands(spec, follow_args, out)
    follow_up = sorted({int(s) for j in follow_jobs for s in job_seeds(j)} - set(pilot))
    declare(out, pilot, follow_up, plan)
    runs = sum(rp.job_runs(j) for j in follow_jobs) - pilot_runs
    progress.total += runs
    print(f"dpbench-reproduce: {paper}: stage 2, the follow-up: {len(follow_up)} more seeds "
          f"({runs} runs; {_plan_text(plan)})", flush=True)
    rp.run_jobs(follow_jobs, dry_run=False, progress=progress, label=f"{paper}/follow-up/")


def _budget_runs(args: argparse.Namespace, pilot_runs: int, elapsed: float) -> float | None:
    """Return the runs the follow-up may use: what ``--budget`` leaves after the pilot, and
    what ``--budget-minutes`` leaves at the pilot's pace (the smaller)."""
    left = []
    if args.budget is not None:
        left.append(float(args.budget - pilot_runs))
    if args.budget_minutes is not None and pilot_runs:
        pace = elapsed / pilot_runs
        left.append(max(0.0, args.budget_minutes * 60 - elapsed) / max(pace, 1e-9))
    return min(left) if left else None


def _claim_sweep_names(spec: dict[str, Any], claim: dict[str, Any]) -> list[str]:
    names = claim.get("sweep") or [s["name"] for s in spec["sweeps"]]
    return [names] if isinstance(names, str) else list(names)


def job_seeds(job: dict) -> list[str]:
    """Return the seeds a sweep job runs."""
    if "tune" in job:
        return [str(s) for s in job["tune"]["seeds"]]
    seeds = next(w for w in job["cmd"] if w.startswith("seed="))
    return seeds.split("=", 1)[1].split(",")


def _plan_text(plan: dict[str, dict]) -> str:
    counts: dict[str, int] = {}
    for p in plan.values():
        counts[p["status"]] = counts.get(p["status"], 0) + 1
    return ", ".join(f"{n} {s}" for s, n in counts.items()) or "no claims"


def plan_notes(record: dict[str, Any] | None, claim_id: str | None) -> list[str]:
    """Return the design's note on a claim: followed up with n seeds, or stopped for
    futility and why."""
    if not record or not claim_id:
        return []
    entry = (record.get("plan") or {}).get(claim_id)
    if not entry:
        return []
    if entry["status"] == "followed up":
        return [f"design: followed up with {entry['follow_up']} seeds a cell (the hint)"]
    if entry["status"] == "futile":
        return [f"design: stopped for futility at the pilot ({entry.get('why', '')})"]
    return []
