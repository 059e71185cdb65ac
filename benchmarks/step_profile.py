"""One case of `overhead.py` in this process: its median step time, and with --profile where a step's time goes.

For comparing commits (run it alternately from two checkouts) and for finding a step's costliest kernels; `make
bench` compares the cases side by side. One thread, and the host memory that steps free kept, as in `make bench`.

    python -m benchmarks.step_profile vit jl_r10_compiled [--steps 8 --warmup 3 --profile]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch._inductor.config as inductor_config
from torch.profiler import ProfilerActivity, profile

from benchmarks.overhead import MODELS, cases, make_step
from dpbench.training.host_memory import keep_freed_host_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=list(MODELS))
    parser.add_argument("case", help=f"one of overhead.py's cases: {', '.join(cases('vit'))}")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print the ops of one more step by self time")
    args = parser.parse_args()
    keep_freed_host_memory()
    torch.set_num_threads(1)
    inductor_config.cpp.enable_kernel_profile = args.profile  # compiled kernels by name in the profile
    step = make_step(args.case, torch.device("cpu"), MODELS[args.model]["batch"], args.model)
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    print(f"{args.model} {args.case}: median {statistics.median(times) * 1e3:.1f} ms over {args.steps} steps "
          f"({', '.join(f'{t * 1e3:.0f}' for t in times)})", flush=True)
    if args.profile:
        with profile(activities=[ProfilerActivity.CPU]) as profiled:
            step()
        print(profiled.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))


if __name__ == "__main__":
    main()
