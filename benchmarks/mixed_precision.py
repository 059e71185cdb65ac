"""Issue 47 benchmark: bf16-mixed against fp32 on two leaderboard tasks at epsilon 3, the same seeds, side by side.

Each run is a real `python -m dpbench` in a fresh interpreter, with the leaderboard's chosen hyperparameters for
DP-SGD on the CNN (MNIST-5k) and DP-Adam on the ViT (MNIST-5k); the test accuracy's mean and 95% Student-t interval
over the seeds per precision, the paired difference bf16 - fp32 with its interval, and the step time and working
set beside them. What must hold: the bf16 mean within the fp32 seeds' interval (the bound on the sum is tested in
tests/privatizers/test_mixed_precision.py).

    python -m benchmarks.mixed_precision [--seeds 5] [--tasks cnn,vit]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import save
from dpbench.report.stats import interval95, mean_of

ROOT = Path(__file__).resolve().parents[1]
TASKS = {  # docs/leaderboard/cells.csv's epsilon-3 test cells: the tuned learning rate and clip norm
    "cnn": ["model=cnn", "data=mnist5k", "optimizer=sgd", "batch_size=500", "epochs=20", "optimizer.lr=4.0",
            "privacy.clip_norm=0.3", "privatizer=vanilla"],
    "vit": ["model=vit", "data=mnist5k", "optimizer=adam", "batch_size=500", "epochs=10", "optimizer.lr=0.008",
            "privacy.clip_norm=9.49", "privatizer=vanilla"],
}
COMMON = ["privacy.epsilon=3", "logger.wandb=false", "logger.csv=false", "trainer.checkpoint=false",
          "trainer.enable_progress_bar=false", "trainer.check_val_every_n_epoch=null", "trainer.num_threads=1"]
PRECISIONS = ("32-true", "bf16-mixed")


def run(overrides: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        command = [sys.executable, "-m", "dpbench", *overrides, *COMMON, f"hydra.run.dir={directory}"]
        env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(overrides)}: {done.stderr.strip()[-500:]}")
        out = json.loads((Path(directory) / "results.json").read_text())
    return {"accuracy": out["test_accuracy"], "epsilon": out["epsilon"], "step_time_s": out["step_time_s"],
            "working_set_mb": out["peak_memory_mb"], "method": out["method"]}


def _fmt(values: list[float], scale: float = 100.0) -> str:
    mean, interval = mean_of(values), interval95(values)
    low, high = interval if interval else (mean, mean)
    return f"{scale * mean:.1f} [{scale * low:.1f}, {scale * high:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--tasks", default=",".join(TASKS))
    args = parser.parse_args()
    results: dict[str, Any] = {"seeds": args.seeds, "tasks": {}}
    for task in args.tasks.split(","):
        runs = {precision: [run([*TASKS[task], f"trainer.precision={precision}", f"seed={seed}"])
                            for seed in range(args.seeds)] for precision in PRECISIONS}
        results["tasks"][task] = runs
        fp32, bf16 = ([r["accuracy"] for r in runs[p]] for p in PRECISIONS)
        fp32_interval = interval95(fp32)
        within = fp32_interval is not None and fp32_interval[0] <= mean_of(bf16) <= fp32_interval[1]
        print(f"{task}: accuracy % fp32 {_fmt(fp32)}, bf16 {_fmt(bf16)}, paired bf16 - fp32 "
              f"{_fmt([b - f for b, f in zip(bf16, fp32, strict=True)])} points; bf16 mean within fp32's interval: "
              f"{within}", flush=True)
        for precision in PRECISIONS:
            step = mean_of([r["step_time_s"] for r in runs[precision]])
            memory = mean_of([r["working_set_mb"] for r in runs[precision]])
            print(f"  {precision:>10}: {step:.3f} s/step, working set {memory:.1f} MB, epsilon "
                  f"{runs[precision][0]['epsilon']:.3f}", flush=True)
    save("mixed_precision", results)


if __name__ == "__main__":
    main()
