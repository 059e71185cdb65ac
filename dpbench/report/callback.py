"""Hydra callback: at the end of every multirun, write the sweep's report and print its summary."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class SweepReport(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from dpbench.report.build import build_report

        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            report = build_report([sweep_dir])
        except FileNotFoundError as error:  # every job failed: nothing to summarize
            log.warning("no sweep report: %s", error)
            return
        print(f"\ndpbench sweep summary ({len(report['rows'])} runs) — {sweep_dir}\n")
        print(report["markdown"].read_text(), flush=True)
