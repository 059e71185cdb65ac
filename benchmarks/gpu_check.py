"""`make gpu-check`: what dpbench needs a GPU to show, in one offline run of a few minutes on one card.

1. the CUDA tests (`pytest -m cuda`: per-sample gradients, clipping and noise on the device, runs through the CLI),
2. the default run (`python -m dpbench`) on CUDA,
3. the memory/throughput frontier of non-private Adam, DP-Adam (ghost norms), DP-Adam with materialized per-sample
   gradients and DP-GRAPE on OPT-1.3B, 6.7B and 2.7B (published shapes, random weights; 64 tokens; the card's whole
   memory as the cap; max_memory_reserved),
4. DP-Adam's and DP-GRAPE's step time against non-private Adam at the fixed batch, from the frontier's trials,
5. bf16-mixed against fp32 (issue 47): the default run, and DP-Adam and DP-GRAPE on OPT-1.3B at batch 4 (speed and
   max_memory_reserved), and an FSDP2 run (`trainer.strategy=fsdp`) on the one card, world size 1, to prove the path,
6. issue 26's ratios on the card (`python -m benchmarks overhead`, one round, CNN and ViT, eight fresh processes):
   vanilla and Opacus against non-private, JL r = 10 against vanilla, each step's arithmetic beside them (the
   record lands in bench_results/overhead.json, as `make bench` leaves it, and is copied beside gpu_check.json);
   without JL's compiled case, whose compilations would take most of the part's share of the budget.

Writes gpu_check.json after every part (a part cut short by the time budget still leaves the ones before it),
gpu_check.md (a short table) and the CUDA tests' whole log (cuda_tests.log). `--dry-run` does it all on CPU with the
small OPT config and small caps.

    python -m benchmarks.gpu_check [--dry-run] [--budget-s 480] [--out outputs/gpu_check]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

import torch

from dpbench.app.frontier import FrontierRow
from dpbench.app.max_batch import Trial
from dpbench.capacity import frontier_table

ROOT = Path(__file__).resolve().parents[1]
METHODS = "grape,nonprivate,vanilla,materialized"
"""GRAPE first: its rows are what only a GPU shows, and a part cut short by its time share keeps the methods before."""
TEXT = ["data=rotten_tomatoes", "data.tokenizer=hf:minilm", "data.max_length=64", "data.train_size=512",
        "optimizer=adam"]
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
       "PYTHONUNBUFFERED": "1"}


class Size(NamedTuple):
    """One OPT of the frontier: its published size (None: the small CPU config), fixed batch and largest batch tried."""

    name: str | None
    batch: int
    limit: int


GPU_SIZES = [Size("1.3b", 4, 8), Size("6.7b", 1, 4), Size("2.7b", 4, 8)]
"""6.7B at batch 1: the GRAPE paper's table reports which methods are out of memory there on an 80 GB card."""
DRY_RUN_SIZES = [Size(None, 4, 8)]


class Deadline:
    def __init__(self, budget_s: float):
        self.end = time.monotonic() + budget_s

    def left(self) -> float:
        return self.end - time.monotonic()


def _run(command: list[str], timeout: float, log: Path | None = None) -> dict:
    """A part as a subprocess under a timeout: its exit code, wall time and the end of its output."""
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, **ENV}, capture_output=True, text=True,
                              timeout=max(1.0, timeout))
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        partial = expired.stdout or ""
        code, output = "timeout", partial.decode(errors="replace") if isinstance(partial, bytes) else partial
    if log is not None:
        log.write_text(output)
    print(output[-4000:], flush=True)
    return {"command": " ".join(command[1:]), "exit": code, "wall_s": round(time.perf_counter() - started, 1),
            "output_tail": output[-1500:]}


def cuda_tests(out: Path, deadline: Deadline, share: float, workers: int) -> dict:
    """The whole pytest log goes to cuda_tests.log beside the record."""
    part = _run([sys.executable, "-m", "pytest", "-q", "-n", str(workers), "-m", "cuda", "-p", "no:cacheprovider",
                 "tests/training/test_cuda.py"], deadline.left() * share, out / "cuda_tests.log")
    summary = [line for line in part["output_tail"].splitlines() if " passed" in line or " failed" in line
               or " skipped" in line]
    return {**part, "summary": summary[-1] if summary else ""}


def default_run(out: Path, deadline: Deadline, share: float, dry_run: bool) -> dict:
    run_dir = out / "default_run"
    extra = ["max_steps=3", "epochs=1"] if dry_run else []
    part = _run([sys.executable, "-m", "dpbench", "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}",
                 *extra], deadline.left() * share)
    results = run_dir / "results.json"
    if results.exists():
        record = json.loads(results.read_text())
        part["results"] = {key: record.get(key) for key in ("device", "test_accuracy", "epsilon", "steps",
                                                               "samples_per_s", "peak_memory_mb", "memory_method",
                                                               "train_time_s")}
    return part


def frontier(out: Path, size: Size, cap_gb: float, deadline: Deadline, share: float) -> dict:
    target = out / f"frontier_{size.name or 'small'}"
    model = ["model=opt", *([f"model.size={size.name}"] if size.name else [])]
    part = _run([sys.executable, "-m", "dpbench.capacity", "frontier", *model, *TEXT, "--privatizers", METHODS,
                 "--cap-gb", f"{cap_gb:.2f}", "--batch", str(size.batch), "--limit", str(size.limit),
                 "--resolution", "1", "--out", str(target)], deadline.left() * share)
    record = target / "frontier.json"
    if record.exists():  # rewritten after each method, so a part cut short keeps what it measured
        part["frontier"] = json.loads(record.read_text())
        part["ratios"] = step_time_ratios(part["frontier"]["rows"])
    return part


PRECISION_RUNS = {  # label -> overrides; each a few steps of `python -m dpbench`
    "default fp32": [],
    "default bf16": ["trainer.precision=bf16-mixed"],
    "DP-Adam OPT fp32": ["model=opt", *TEXT, "privatizer=vanilla", "batch_size=4"],
    "DP-Adam OPT bf16": ["model=opt", *TEXT, "privatizer=vanilla", "batch_size=4", "trainer.precision=bf16-mixed"],
    "DP-GRAPE OPT fp32": ["model=opt", *TEXT, "privatizer=grape", "batch_size=4"],
    "DP-GRAPE OPT bf16": ["model=opt", *TEXT, "privatizer=grape", "batch_size=4", "trainer.precision=bf16-mixed"],
    "default FSDP2 (1 device)": ["trainer.strategy=fsdp", "trainer.devices=1"],
}
PRECISION_FIELDS = ("method", "precision", "device", "steps", "samples_per_s", "step_time_s", "peak_memory_mb",
                    "max_memory_reserved_mb", "test_accuracy", "epsilon")


def precision_and_sharding(out: Path, deadline: Deadline, share: float, dry_run: bool) -> dict:
    """Each run of PRECISION_RUNS in turn, with an even share of the part's time; OPT-1.3B on the card (the small
    OPT config in a dry run)."""
    ending, runs = time.monotonic() + deadline.left() * share, {}
    size = [] if dry_run else ["model.size=1.3b"]
    for index, (label, overrides) in enumerate(PRECISION_RUNS.items()):
        run_dir = out / "precision" / label.replace(" ", "_").replace("(", "").replace(")", "")
        opt = size if "model=opt" in overrides else []
        part = _run([sys.executable, "-m", "dpbench", *overrides, *opt, "max_steps=8", "profiler.warmup_steps=3",
                     "trainer.checkpoint=false", "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}"],
                    (ending - time.monotonic()) / (len(PRECISION_RUNS) - index))
        results = run_dir / "results.json"
        record = json.loads(results.read_text()) if results.exists() else {}
        runs[label] = {"exit": part["exit"], "wall_s": part["wall_s"],
                       **{key: record.get(key) for key in PRECISION_FIELDS}}
    return {"runs": runs, "ratios": precision_ratios(runs)}


def precision_ratios(runs: dict[str, dict]) -> dict[str, float | None]:
    """bf16 over fp32 of each pair: step time and reserved memory (peak memory on CPU)."""
    ratios: dict[str, float | None] = {}
    for label, run in runs.items():
        if not label.endswith("bf16"):
            continue
        base = runs.get(label.replace("bf16", "fp32"), {})
        for key in ("step_time_s", "max_memory_reserved_mb", "peak_memory_mb"):
            ratios[f"{label[:-5]} {key} bf16/fp32"] = (run[key] / base[key] if run.get(key) and base.get(key)
                                                       else None)
    return ratios


def overhead(out: Path, deadline: Deadline, share: float, dry_run: bool) -> dict:
    """The overhead benchmark's ratios on this device; its record is copied beside gpu_check.json."""
    saved, started = ROOT / "bench_results" / "overhead.json", time.time()
    sizes = ["--models", "cnn", "--steps", "2", "--warmup", "1"] if dry_run else ["--models", "cnn,vit", "--steps",
                                                                                  "5", "--warmup", "2"]
    part = _run([sys.executable, "-m", "benchmarks", "overhead", *sizes, "--rounds", "1", "--eager-only"],
                deadline.left() * share)
    if saved.exists() and saved.stat().st_mtime >= started:  # this run's record, not an earlier one's
        (out / "overhead.json").write_text(saved.read_text())
        part["ratios"] = json.loads(saved.read_text())["ratios"]
    return part


def step_time_ratios(rows: list[dict]) -> dict[str, float | None]:
    """A method's step time over non-private Adam's, both at the fixed batch: their samples/s inverted."""
    rates = {row["privatizer"]: row["samples_per_s_at_fixed"] for row in rows}
    base = rates.get("nonprivate")
    return {name: (base / rate if base and rate else None) for name, rate in rates.items() if name != "nonprivate"}


def table(record: dict) -> str:
    lines = [f"# GPU check, {record['date']} on {record['device']} ({record['wall_s']:.0f} s)", ""]
    tests = record.get("cuda_tests", {})
    lines.append(f"CUDA tests: {tests.get('summary') or tests.get('exit')} ({tests.get('wall_s')} s)")
    run = record.get("default_run", {}).get("results")
    if run:
        lines.append(f"default run: {json.dumps(run)}")
    precision = record.get("precision_and_sharding", {})
    for label, run in precision.get("runs", {}).items():
        lines.append(f"{label}: exit {run['exit']}, {run.get('samples_per_s')} samples/s, "
                     f"{run.get('max_memory_reserved_mb') or run.get('peak_memory_mb')} MB, {run.get('method')}")
    for label, value in precision.get("ratios", {}).items():
        lines.append(f"- {label}: {value:.2f}" if value is not None else f"- {label}: n/a")
    ratios = record.get("overhead", {}).get("ratios")
    if ratios:
        lines += ["", "## issue 26's ratios (one round)", *(f"- {label}: {value:.2f}" if value is not None
                                                           else f"- {label}: n/a" for label, value in ratios.items())]
    for key, part in record.items():
        if key.startswith("frontier_") and "frontier" in part:
            rows = [FrontierRow(**{**row, "trials": [Trial(**t) for t in row["trials"]]})
                    for row in part["frontier"]["rows"]]
            lines += ["", f"## {key} ({' '.join(part['frontier']['overrides'][:2])})",
                      frontier_table(rows, part["frontier"]["cap_mb"], record["device"], part["frontier"]["wall_s"]),
                      "", f"step time over non-private Adam at batch {part['frontier']['fixed_batch']}: " + ", ".join(
                          f"{name} {ratio:.2f}x" if ratio else f"{name} -" for name, ratio in part["ratios"].items())]
        elif key.startswith("frontier_"):
            lines += ["", f"## {key}: not measured ({part['exit']}, {part['wall_s']} s)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="on CPU, the small OPT config and small caps")
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--out", type=Path, default=Path("outputs/gpu_check"))
    args = parser.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("gpu-check: no CUDA device here; `--dry-run` runs the same parts on CPU at small sizes")
    started, deadline = time.perf_counter(), Deadline(args.budget_s)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    device = "CPU (dry run)" if args.dry_run else torch.cuda.get_device_name()
    record: dict = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": device,
                    "torch": torch.__version__, "dry_run": args.dry_run}
    if args.dry_run:
        sizes, cap_gb, workers = DRY_RUN_SIZES, 3.0, 2
    else:
        sizes, workers = GPU_SIZES, 8
        cap_gb = torch.cuda.get_device_properties(0).total_memory / 2**30
    parts = [("cuda_tests", lambda: cuda_tests(out, deadline, 0.25, workers)),
             ("default_run", lambda: default_run(out, deadline, 0.15, args.dry_run)),
             ("precision_and_sharding", lambda: precision_and_sharding(out, deadline, 0.3, args.dry_run)),
             ("overhead", lambda: overhead(out, deadline, 0.4, args.dry_run))]
    for index, size in enumerate(sizes):
        share = 1.0 / (len(sizes) - index)  # an even split of what is left
        parts.append((f"frontier_{size.name or 'small'}", lambda size=size, share=share: frontier(
            out, size, cap_gb, deadline, share)))
    for name, part in parts:
        print(f"\n=== {name} ({deadline.left():.0f} s left) ===", flush=True)
        record[name] = part()
        record["wall_s"] = time.perf_counter() - started
        (out / "gpu_check.json").write_text(json.dumps(record, indent=2))
        (out / "gpu_check.md").write_text(table(record))
    print((out / "gpu_check.md").read_text())


if __name__ == "__main__":
    main()
