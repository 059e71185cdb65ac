"""python -m dpbench.capacity max_batch|frontier [--cap-mb MB | --cap-gb GB] [--privatizers a,b] [overrides ...]

max_batch: for each privatizer, the largest batch that trains under the memory cap; writes max_batch.json (read by
`python -m dpbench.report`) and prints a table.
frontier: the same search plus each method's peak memory and samples/s at its largest batch and at a fixed batch
(--batch), a method that does not fit at batch 1 marked out of memory; writes frontier.json and frontier.png (peak
memory against batch, cap drawn); trainer.precision=bf16-mixed measures at bf16; NAME@N shards a method over N ranks
(FSDP2; its peak is the largest rank's), e.g.
  python -m dpbench.capacity frontier model=opt model.size=1.3b data=rotten_tomatoes data.max_length=32 --cap-gb 20
  python -m dpbench.capacity frontier model=opt ... --privatizers grape,vanilla@4 --cap-gb 80
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from hydra.errors import HydraException

from dpbench.app.frontier import FRONTIER_FIELDS, FrontierRow, frontier_row, refused_row
from dpbench.app.frontier_plot import FRONTIER_PLOT, optimizer_of, plot_frontier, title_of
from dpbench.app.max_batch import MEMORY_FIELDS, MaxBatchResult, find_max_batch, trial_device
from dpbench.core.errors import ConfigurationError

MAX_BATCH_FILE = "max_batch.json"
FRONTIER_FILE = "frontier.json"
FRONTIER_PRIVATIZERS = "nonprivate,vanilla,materialized,grape,dp_galore"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dpbench.capacity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["max_batch", "frontier"])
    cap = parser.add_mutually_exclusive_group(required=True)
    cap.add_argument("--cap-mb", type=float, help="memory cap in MB (CPU: resident; CUDA: device)")
    cap.add_argument("--cap-gb", type=float, help="memory cap in GiB")
    parser.add_argument("--privatizers", default=None,
                        help=f"comma-separated privatizer configs (max_batch: nonprivate,vanilla; frontier: "
                             f"{FRONTIER_PRIVATIZERS}); frontier: NAME@N shards NAME over N ranks "
                             "(trainer.strategy=fsdp), e.g. grape,vanilla@4")
    parser.add_argument("--start", type=int, default=8, help="max_batch: the first batch tried")
    parser.add_argument("--batch", type=int, default=4, help="frontier: the fixed batch, also the first tried")
    parser.add_argument("--limit", type=int, default=1 << 16, help="largest batch tried")
    parser.add_argument("--resolution", type=float, default=0.05,
                        help="frontier: relative precision of the bisection (1: doubling only)")
    parser.add_argument("--steps", type=int, default=6, help="frontier: steps per trial, the first a warm-up")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=cnn_large data=mnist5k")
    return parser


def main() -> None:
    args = _parser().parse_intermixed_args()
    cap_mb = args.cap_mb if args.cap_mb is not None else args.cap_gb * 1024
    try:
        if args.command == "max_batch":
            max_batch(args, cap_mb)
        else:
            frontier(args, cap_mb)
    except (ConfigurationError, HydraException) as error:  # a cap that cannot work, or an override Hydra refuses
        print(f"dpbench.capacity: error: {error}", file=sys.stderr)
        sys.exit(2)


def max_batch(args: argparse.Namespace, cap_mb: float) -> None:
    rows = []
    for privatizer in (args.privatizers or "nonprivate,vanilla").split(","):
        print(f"{privatizer}:", flush=True)
        result = find_max_batch([*args.overrides, f"privatizer={privatizer}"], cap_mb, args.start, args.limit)
        rows.append({"privatizer": privatizer, **result.to_dict()})
    out = args.out or Path("outputs/max_batch")
    out.mkdir(parents=True, exist_ok=True)
    (out / MAX_BATCH_FILE).write_text(json.dumps({"memory_fields_mb": MEMORY_FIELDS, "results": rows}, indent=2))
    print(f"\nlargest batch under {cap_mb:g} MB ({rows[0]['device']}: {rows[0]['cap_applies_to']}):")
    for row in rows:
        print(f"  {row['privatizer']:>20}: {row['max_batch_size']}" + (f"  ({row['note']})" if row["note"] else ""))
    print(f"wrote {out / MAX_BATCH_FILE}")


def frontier(args: argparse.Namespace, cap_mb: float) -> list[FrontierRow]:
    """frontier.json is rewritten after every trial (the method in progress under `in_progress`) and the plot after
    each method, so a search cut short keeps what it measured; each method's header says how far the search is and
    about how long the rest takes."""
    started = time.perf_counter()
    out = args.out or Path("outputs/frontier")
    out.mkdir(parents=True, exist_ok=True)
    title = title_of(args.overrides)
    privatizers = (args.privatizers or FRONTIER_PRIVATIZERS).split(",")
    device = trial_device(args.overrides)
    device_name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    rows: list[FrontierRow] = []

    def write(in_progress: dict | None = None) -> None:
        record = {"overrides": args.overrides, "cap_mb": cap_mb, "device": device, "device_name": device_name,
                  "fixed_batch": args.batch, "limit": args.limit, "steps_per_trial": args.steps,
                  "wall_s": time.perf_counter() - started, "load_average": os.getloadavg()[0], "cpus": os.cpu_count(),
                  "fields_mb": FRONTIER_FIELDS, "rows": [row.to_dict() for row in rows], "in_progress": in_progress}
        (out / FRONTIER_FILE).write_text(json.dumps(record, indent=2))

    for index, privatizer in enumerate(privatizers):
        print(f"[{index + 1}/{len(privatizers)}] {privatizer}{_remaining(started, index, len(privatizers))}:",
              flush=True)

        def progress(result: MaxBatchResult, privatizer: str = privatizer) -> None:
            write({"privatizer": privatizer, "trials": [asdict(trial) for trial in result.trials]})

        try:
            rows.append(frontier_row(privatizer, args.overrides, cap_mb, args.batch, args.limit, args.resolution,
                                     args.steps, on_trial=progress))
        except ConfigurationError as refusal:  # this method refuses the model: a row that says so, and on
            print(f"  refused: {refusal}", flush=True)
            rows.append(refused_row(privatizer, device, args.batch, str(refusal)))
        write()
        plot_frontier(rows, cap_mb, f"{title} ({device_name})", out / FRONTIER_PLOT, optimizer_of(args.overrides))
    print(frontier_table(rows, cap_mb, device_name, time.perf_counter() - started))
    print(f"wrote {out / FRONTIER_FILE} and {out / FRONTIER_PLOT}")
    return rows


def _remaining(started: float, done: int, total: int) -> str:
    """About how long the methods after the `done` finished ones take, at the mean so far (unknown before one)."""
    if done == 0:
        return ""
    elapsed = time.perf_counter() - started
    return f" ({elapsed:.0f} s so far; about {elapsed / done * (total - done):.0f} s left at the mean of {done})"


def _mb(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "-"


def _rate(value: float | None) -> str:
    return f"{value:,.1f}" if value is not None else "-"


def frontier_table(rows: list[FrontierRow], cap_mb: float, device_name: str, wall_s: float) -> str:
    fixed = rows[0].fixed_batch
    lines = [f"\nfrontier under {cap_mb:g} MB on {device_name} ({wall_s:.0f} s); peak = "
             + ("max_memory_reserved" if rows[0].device == "cuda"
                else "the process's working set (malloc's bytes in use at their peak), interpreter included"),
             f"| method | max batch | peak at max (MB) | samples/s at max | peak at {fixed} (MB) "
             f"| samples/s at {fixed} | interpreter (MB) | note |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        batch = ("refused" if row.refused else "OOM at 1" if row.out_of_memory_at_1
                 else str(row.max_batch_size))
        name = f"{row.privatizer} (FSDP2 over {row.devices}, largest rank)" if row.devices > 1 else row.privatizer
        lines.append(f"| {name} | {batch} | {_mb(row.peak_at_max_mb)} | {_rate(row.samples_per_s_at_max)} "
                     f"| {_mb(row.peak_at_fixed_mb)} | {_rate(row.samples_per_s_at_fixed)} "
                     f"| {_mb(row.interpreter_rss_mb)} | {row.note} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
