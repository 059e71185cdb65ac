"""Issue 48 benchmark: the methods' memory claims on the working set (results.json `peak_memory_mb` on CPU: the peak
of malloc's bytes in use, dpbench/profiling/working_set.py), each configuration a real run of `python -m dpbench` in
a process of its own, `--repeats` times, beside the resident high-water mark the CPU figure used to be.

Targets: JL r=1 on the BiLSTM (batch 64, length 150) at most 1.2x non-private's working set (Bu et al. 2021);
DP-GRAPE on the 4.8M-parameter ViT at most 0.7x DP-Adam's (Mulrooney et al. 2025); the same configuration with
`trainer.keep_freed_host_memory` true and false, and repeated runs, within 5% of each other.

    python -m benchmarks.working_set [--repeats 3] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import machine, save

ROOT = Path(__file__).resolve().parents[1]
LSTM = ["model=lstm", "data=rotten_tomatoes", "data.max_length=150", "batch_size=64", "optimizer=adam",
        "privacy.epsilon=null", "privacy.noise_multiplier=1.0", "privacy.allow_infinite_epsilon=true"]  # memory only
VIT = ["+experiment=grape_memory", "batch_size=128", "profiler.fresh_process=never"]
COMPARISONS = {
    "JL r=1 / non-private, BiLSTM": (LSTM + ["privatizer=jl_r1"], LSTM + ["privatizer=nonprivate"], 1.2),
    "DP-GRAPE / DP-Adam, ViT 4.8M": (VIT + ["privatizer=grape"], VIT + ["privatizer=vanilla"], 0.7),
}
COMMON = ["logger.wandb=false", "logger.csv=false", "trainer.checkpoint=false", "trainer.enable_progress_bar=false",
          "trainer.check_val_every_n_epoch=null", "eval_batch_size=256", "trainer.num_threads=1"]


def run(overrides: list[str], steps: int) -> dict[str, Any]:
    """One run in a fresh interpreter: its working set and resident peak, from results.json."""
    with tempfile.TemporaryDirectory() as directory:
        command = [sys.executable, "-m", "dpbench", *overrides, *COMMON, f"max_steps={steps}",
                   "profiler.warmup_steps=5", f"hydra.run.dir={directory}"]
        env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
        out = json.loads((Path(directory) / "results.json").read_text())
    return {"working_set_mb": out["peak_memory_mb"], "resident_peak_mb": out["resident_peak_mb"],
            "samples_per_s": out["samples_per_s"], "method": out["method"]}


def spread(values: list[float]) -> float:
    """(largest - smallest) / smallest: the repeats' disagreement."""
    return (max(values) - min(values)) / min(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    args, _ = parser.parse_known_args()
    rows = []
    print(f"{'comparison':>30} {'working set MB (method / baseline)':>36} {'ratio':>6} {'target':>7} "
          f"{'resident MB (method / baseline)':>32} {'repeat spread':>14}")
    for name, (method, baseline, target) in COMPARISONS.items():
        measured = {label: [run(overrides, args.steps) for _ in range(args.repeats)]
                    for label, overrides in (("method", method), ("baseline", baseline))}
        failed = [r["error"] for runs in measured.values() for r in runs if "error" in r]
        if failed:
            print(f"{name:>30}  failed: {failed[0]}", flush=True)
            rows.append({"comparison": name, "error": failed[0]})
            continue
        working = {k: statistics.median(r["working_set_mb"] for r in runs) for k, runs in measured.items()}
        resident = {k: statistics.median(r["resident_peak_mb"] for r in runs) for k, runs in measured.items()}
        spreads = {k: spread([r["working_set_mb"] for r in runs]) for k, runs in measured.items()}
        ratio = working["method"] / working["baseline"]
        print(f"{name:>30} {working['method']:17.1f} / {working['baseline']:<16.1f} {ratio:6.2f} {target:7.2f} "
              f"{resident['method']:15.1f} / {resident['baseline']:<14.1f} {max(spreads.values()):13.1%} "
              f"{'ok' if ratio <= target else 'ABOVE TARGET'}", flush=True)
        rows.append({"comparison": name, "target": target, "ratio": ratio, "working_set_mb": working,
                     "resident_peak_mb": resident, "repeat_spread": spreads, "runs": measured})
    allocator = {setting: run(LSTM + ["privatizer=jl_r1", f"trainer.keep_freed_host_memory={setting}"], args.steps)
                 for setting in ("true", "false")}
    if all("error" not in r for r in allocator.values()):
        values = [r["working_set_mb"] for r in allocator.values()]
        print(f"JL r=1 BiLSTM, keep_freed_host_memory true / false: working set {values[0]:.1f} / {values[1]:.1f} MB "
              f"({spread(values):.1%} apart); resident {allocator['true']['resident_peak_mb']:.1f} / "
              f"{allocator['false']['resident_peak_mb']:.1f} MB", flush=True)
    save("working_set", {"machine": machine(), "steps": args.steps, "repeats": args.repeats, "comparisons": rows,
                         "allocator": allocator})


if __name__ == "__main__":
    main()
