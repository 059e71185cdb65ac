"""Hydra callback: at the end of every multirun, write the sweep's report and print its summary."""

from __future__ import annotations

import json
import logging
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
        _print_refusals(sweep_dir)
        try:
            report = build_report([sweep_dir])
        except FileNotFoundError as error:  # every job failed: nothing to summarize
            log.warning("no sweep report: %s", error)
            return
        print(f"\ndpbench sweep summary ({len(report['rows'])} runs) — {sweep_dir}\n")
        print(report["markdown"].read_text(), flush=True)


def _print_refusals(sweep_dir: Path) -> None:
    refused = sorted(sweep_dir.rglob(REFUSED_FILE))
    if not refused:
        return
    print(f"\ndpbench: {len(refused)} job(s) of this sweep were refused and did not run:", flush=True)
    for path in refused:
        record = json.loads(path.read_text())
        print(f"  {' '.join(record['overrides'])}: {record['error']}", flush=True)
