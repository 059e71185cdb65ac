"""python -m dpbench.report DIR [DIR ...] [--out OUT]: table (markdown, CSV) and plots of runs and sweeps."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpbench.core.wording import counted
from dpbench.report.build import build_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directories", nargs="+", type=Path, help="run directories, sweep directories, or both")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write (default: the directory itself when one is given; for several, a new "
                             "outputs/reports/<time>, so that no sweep's own report is overwritten)")
    args = parser.parse_args()
    try:
        report = build_report(args.directories, args.out)
    except FileNotFoundError as error:  # a missing directory, or one without any results.json
        print(f"dpbench.report: error: {error}", file=sys.stderr)
        sys.exit(2)
    print(report["markdown"].read_text())
    print(f"{counted(len(report['rows']), 'run')}; wrote {report['markdown']}, {report['csv']} (in {report['out']})")
    for plot in report["plots"]:
        print(f"plot: {plot}")


if __name__ == "__main__":
    main()
