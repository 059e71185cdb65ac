"""python -m dpbench.leaderboard [--quick] [--report-only] [--dry-run] [--recost TASK[,TASK]] [--root DIR] [--docs DIR]
[--suite FILE] [--allow-mixed-commits]
[--private-tuning [--plan] [--tuning-mean M] [--tuning-shape S] [--score-noise Z]]."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from dpbench.core.errors import ConfigurationError
from dpbench.leaderboard.cell_order import Scheduler
from dpbench.leaderboard.launch import DEFAULT_LAUNCHER, LAUNCHER_NAMES, make_launcher
from dpbench.leaderboard.private_tuning import (
    DEFAULT_SCORE_NOISE,
    DEFAULT_SHAPE,
    PrivateTuning,
    describe,
    header,
    plan_rows,
)
from dpbench.leaderboard.provenance import ALLOW_FLAG
from dpbench.leaderboard.recost import commit, remeasure
from dpbench.leaderboard.recost import rewrite as rewrite_costs_section
from dpbench.leaderboard.remaining import remaining
from dpbench.leaderboard.report import build, record_invocation
from dpbench.leaderboard.scale import rewrite as rewrite_scale_section
from dpbench.leaderboard.suite import Suite, load_suite
from dpbench.privacy.tuning import TrialCount

STOPPED = 128 + signal.SIGTERM


def _stop(signum: int, frame: object) -> None:
    """SIGTERM (a batch system's time limit, `kill`) unwinds like Ctrl-C, so that the running cell is stopped too."""
    raise SystemExit(STOPPED)


NOTE = ("Note: each run's epsilon does not count the tuning trials; selecting hyperparameters on private data "
        "spends privacy that the leaderboard does not include (--private-tuning tunes privately and reports it).")
TOTAL_NOTE = ("Note: each private cell's budget is a total: its tuning trials, their noisy validation scores and its "
              "final runs spend it together, each run's noise calibrated so (per-run epsilon beside it).")
PRIVATE_NOTE = ("Private tuning: each private method's epsilon with its tuning is reported beside its per-run epsilon; "
                "the non-private baseline is tuned on the grid.")


def _note(suite: Suite, tuning: PrivateTuning | None) -> str:
    """What the run's epsilons count: private tuning's own figures, a total, or each run alone."""
    if tuning:
        return PRIVATE_NOTE
    return TOTAL_NOTE if suite.total else NOTE


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dpbench.leaderboard", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the reduced profile (under 15 minutes on 2 cores)")
    parser.add_argument("--profile", default=None, help="a profile of the suite file (default: full, or quick)")
    parser.add_argument("--suite", type=Path, default=None, help="suite file (default: conf/leaderboard/suite.yaml)")
    parser.add_argument("--root", type=Path, default=None,
                        help="where the cells live (default: outputs/leaderboard/<profile>)")
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="where leaderboard.md and its figures go")
    parser.add_argument("--report-only", action="store_true", help="regenerate the report from the cells, run none")
    parser.add_argument(ALLOW_FLAG, action="store_true",
                        help="report cells whose privacy-relevant code may differ (other commits, a dirty tree, cells "
                             "recorded before cells kept their commit) together; the report says so. Without it the "
                             "report refuses them")
    parser.add_argument("--scale-only", action="store_true",
                        help="rewrite only the report's 'Claims at scale' section, from the frontier records under "
                             "DOCS/leaderboard/frontier/ (the cells' tables are kept as they are)")
    parser.add_argument("--recost", default=None, metavar="TASK[,TASK]",
                        help="run the named tasks' chosen test cells again (their first seed, the hyperparameters in "
                             "DOCS/leaderboard/cells.csv, one at a time) and rewrite only the report's 'Costs "
                             "re-measured' section (cells under outputs/leaderboard/costs/<commit> unless --root)")
    parser.add_argument("--launcher", choices=LAUNCHER_NAMES, default=DEFAULT_LAUNCHER,
                        help="fork: each cell a forked child of a warm interpreter (default where available); "
                             "subprocess: a new `python -m dpbench` per cell; submitit: each cell a submitit job "
                             "(SLURM where sbatch is found, else a local process)")
    parser.add_argument("--submitit", action="append", default=[], metavar="KEY=VALUE",
                        help="a submitit executor parameter, e.g. slurm_partition=gpu timeout_min=60 gpus_per_node=1")
    parser.add_argument("--jobs", type=_positive, default=1,
                        help="(task, method) pipelines run at once (default 1: each cell alone on the machine, so its "
                             "speed and memory are its own; raise it on a cluster)")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the suite's cells, recorded or to run, and estimate the time the rest takes")
    parser.add_argument("--private-tuning", action="store_true",
                        help="Papernot-Steinke private tuning of every private method: a secret random number of "
                             "trials over its grid, noisy validation scores, only the winner released and its privacy "
                             "counted beside each run's (cells under outputs/leaderboard/<profile>-private; with "
                             "--plan: print each method's epsilon with tuning, run no cell)")
    parser.add_argument("--plan", action="store_true",
                        help="with --private-tuning: print each method's per-run epsilon and its epsilon with private "
                             "tuning, run no cell")
    parser.add_argument("--tuning-mean", type=float, default=None,
                        help="mean number of private tuning trials (default: the profile's trials)")
    parser.add_argument("--tuning-shape", type=float, default=DEFAULT_SHAPE,
                        help="law of the number of trials: 0 logarithmic, 1 geometric (default), inf Poisson, another "
                             "positive number a truncated negative binomial of that shape")
    parser.add_argument("--score-noise", type=float, default=DEFAULT_SCORE_NOISE,
                        help="noise multiplier of each trial's validation score, in units of its sensitivity (1/n for "
                             f"accuracy over n validation examples; default {DEFAULT_SCORE_NOISE:g})")
    return parser.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parameter(text: str) -> tuple[str, object]:
    """KEY=VALUE with VALUE read as YAML (60 -> int, true -> bool, gpu -> str)."""
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise ConfigurationError(f"--submitit {text!r}: write KEY=VALUE, e.g. --submitit timeout_min=60")
    return key, yaml.safe_load(value)


def _private_tuning(args: argparse.Namespace, suite: Suite) -> PrivateTuning | None:
    """The private tuning the flags ask for (None without --private-tuning)."""
    if not args.private_tuning:
        return None
    mean = suite.trials if args.tuning_mean is None else args.tuning_mean
    return PrivateTuning(TrialCount(mean, args.tuning_shape), args.score_noise)


def _plan(suite: Suite, tuning: PrivateTuning) -> int:
    print(header(suite, tuning), flush=True)
    for row in plan_rows(suite, tuning):
        print(describe(row), flush=True)
    return 0


def _recost(args: argparse.Namespace, suite: Suite, parameters: dict[str, object]) -> int:
    clashing = [flag for flag, given in (("--report-only", args.report_only), ("--dry-run", args.dry_run),
                                         ("--private-tuning", args.private_tuning)) if given]
    if clashing:
        print(f"dpbench.leaderboard: error: --recost runs cells of its own; it does not combine with "
              f"{', '.join(clashing)}", file=sys.stderr)
        return 2
    measured = commit()
    if measured.endswith("-dirty"):  # an edited tree measures afresh each time, never an earlier edit's cells
        measured += datetime.now(timezone.utc).strftime("-%Y%m%dT%H%M%S.%f")
    root = args.root or Path("outputs") / "leaderboard" / "costs" / measured
    try:
        remeasure(suite, [name for name in args.recost.split(",") if name], args.docs, root, args.launcher,
                  parameters)
    except ConfigurationError as error:
        print(f"dpbench.leaderboard: error: {error}", file=sys.stderr)
        return 2
    written = rewrite_costs_section(args.docs, [task.name for task in suite.tasks], suite.tune_epsilon)
    print(f"wrote {written} (cells under {root})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.scale_only:
        print(f"wrote {rewrite_scale_section(args.docs)}")
        return 0
    profile = args.profile or ("quick" if args.quick else "full")
    try:
        suite = load_suite(profile, args.suite)
        parameters = dict(_parameter(text) for text in args.submitit)
        make_launcher(args.launcher, parameters)
        if args.recost is not None:
            return _recost(args, suite, parameters)
        tuning = _private_tuning(args, suite)
    except ConfigurationError as error:
        print(f"dpbench.leaderboard: error: {error}", file=sys.stderr)
        return 2
    if args.plan:
        if tuning is None:
            print("dpbench.leaderboard: error: --plan goes with --private-tuning (--dry-run lists the cells)",
                  file=sys.stderr)
            return 2
        return _plan(suite, tuning)
    root = args.root or Path("outputs") / "leaderboard" / (f"{profile}-private" if tuning else profile)
    command = ["python", "-m", "dpbench.leaderboard", *(sys.argv[1:] if argv is None else argv)]
    if args.dry_run:
        return _dry_run(suite, root, args.jobs, tuning)
    if not args.report_only:
        stopped = _run_cells(suite, root, args, parameters, tuning, command)
        if stopped is not None:
            return stopped
    try:
        path = build(suite, root, args.docs, " ".join(command), args.allow_mixed_commits)
    except ConfigurationError as error:
        print(f"dpbench.leaderboard: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}\n{_note(suite, tuning)}")
    return 0


def _dry_run(suite: Suite, root: Path, jobs: int, tuning: PrivateTuning | None) -> int:
    """Every cell the suite would run, marked recorded or to run, without running one."""
    scheduler = Scheduler(suite, root, dry_run=True)
    scheduler.run()
    left = remaining(scheduler.planned, root)
    pending = {id(cell) for cell in left.to_run}
    for cell in scheduler.planned:
        print(f"{'to run' if id(cell) in pending else 'recorded':>8}  {cell.directory(root)}")
    print(left.describe(jobs)
          + ("; with --private-tuning each private method's trials are a secret random number instead of its "
             "grid's first range" if tuning else ""))
    return 0


def _run_cells(suite: Suite, root: Path, args: argparse.Namespace, parameters: dict, tuning: PrivateTuning | None,
               command: list[str]) -> int | None:
    """Run the suite's remaining cells; the exit code when a signal stopped it, else None."""
    print(_note(suite, tuning), flush=True)
    started, clock = datetime.now(timezone.utc), time.perf_counter()
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        Scheduler(suite, root, launcher=args.launcher, parameters=parameters, jobs=args.jobs,
                  private_tuning=tuning).run()
    except (KeyboardInterrupt, SystemExit) as stop:
        record_invocation(root, command, started, time.perf_counter() - clock, stopped=True)
        print(f"dpbench.leaderboard: stopped; the finished cells are kept under {root}: run the same command "
              f"again to continue", file=sys.stderr)
        return STOPPED if isinstance(stop, SystemExit) else 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    record_invocation(root, command, started, time.perf_counter() - clock)
    return None

if __name__ == "__main__":
    # Here, not in main(): a caller of main() (a test, a notebook) keeps its own logging and streams.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    sys.exit(main())
