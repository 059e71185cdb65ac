"""Hydra callback: at the end of every multirun, write the sweep's report and print its summary."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from dpbench.results import REFUSED_FILE

log = logging.getLogger(__name__)


class SweepReport(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from dpbench.report.build import build_report

        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            report = build_report([sweep_dir])
        except FileNotFoundError as error:  # every job failed: nothing to summarize
            log.warning("no sweep report: %s", error)
        else:
            print(f"\ndpbench sweep summary ({len(report['rows'])} runs) — {sweep_dir}\n")
            print(report["markdown"].read_text(), flush=True)
        if _print_refusals(sweep_dir):
            sys.exit(2)  # the sweep ran what it could; a script must still notice that it is incomplete


def _print_refusals(sweep_dir: Path) -> int:
    refused = sorted(sweep_dir.rglob(REFUSED_FILE))
    if not refused:
        return 0
    print(f"\ndpbench: {len(refused)} job(s) of this sweep were refused and did not run:", flush=True)
    for path in refused:
        record = json.loads(path.read_text())
        print(f"  {' '.join(record['overrides'])}: {record['error']}", flush=True)
    return len(refused)
