"""Hydra callback: at the end of every multirun, write the sweep's report and print its summary; for the whole
multirun, SIGINT / SIGTERM stop the sweep (see `dpbench.app.stop_relay`)."""

from __future__ import annotations

import json
import logging
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from dpbench.app.stop_relay import RELAY
from dpbench.core.results import REFUSED_FILE
from dpbench.core.wording import counted

log = logging.getLogger(__name__)


class SweepReport(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        RELAY.install()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        stopped_by = RELAY.received  # a signal after the last job: the sweep is complete, but the user asked to stop
        RELAY.restore()
        end_sweep(Path(config.hydra.sweep.dir), stopped_by)


def end_sweep(sweep_dir: Path, stopped_by: int | None) -> None:
    """Print the report of the runs that finished and the refused jobs. A stopped sweep then says how to continue
    and exits 128 + the signal; a sweep with refused jobs exits 2 (a script must notice that it is incomplete)."""
    from dpbench.report.build import build_report

    try:
        report = build_report([sweep_dir])
    except FileNotFoundError as error:  # no job finished: nothing to summarize
        log.warning("no sweep report: %s", error)
    else:
        print(f"\ndpbench sweep summary ({counted(len(report['rows']), 'run')}) — {sweep_dir}\n")
        print(report["markdown"].read_text(), flush=True)
    refused = _print_refusals(sweep_dir)
    if stopped_by:
        print(f"dpbench: sweep stopped by {signal.Signals(stopped_by).name}; to continue it, rerun the same command "
              f"with hydra.sweep.dir={shlex.quote(str(sweep_dir))} resume=auto (finished jobs are kept, an "
              "interrupted one continues from its checkpoint)", file=sys.stderr, flush=True)
        sys.exit(128 + stopped_by)
    if refused:
        sys.exit(2)


def _print_refusals(sweep_dir: Path) -> int:
    refused = sorted(sweep_dir.rglob(REFUSED_FILE))
    if not refused:
        return 0
    print(f"\ndpbench: {len(refused)} job(s) of this sweep were refused and did not run:", flush=True)
    for path in refused:
        record = json.loads(path.read_text())
        print(f"  {' '.join(record['overrides'])}: {record['error']}", flush=True)
    return len(refused)
