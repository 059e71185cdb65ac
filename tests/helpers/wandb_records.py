"""Read an offline W&B run back from its `run-<id>.wandb` file, as `wandb sync` would upload it.

The installed wandb has no Python reader of its own (wandb-core writes the file): it is a LevelDB-style log (a
7-byte ":W&B" header, 32 KiB blocks of records with a 7-byte header: crc32, length, kind) of `Record` protos.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    position, pending = HEADER, b""
    while position + HEADER <= len(data):
        if BLOCK - position % BLOCK < HEADER:  # a block's tail too short for a header is padding
            position += BLOCK - position % BLOCK
            continue
        length, kind = struct.unpack_from("<HB", data, position + 4)
        pending += data[position + HEADER:position + HEADER + length]
        position += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


@dataclass
class OfflineRun:
    """What the W&B UI would show of a run: its group, job type, name, tags, config and final summary."""

    directory: Path
    group: str
    job_type: str
    name: str
    tags: list[str]
    config: dict[str, Any]
    summary: dict[str, Any]


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read_offline_run(run_dir: Path) -> OfflineRun:
    """The single offline W&B run under a dpbench run directory."""
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    run, config, summary = None, {}, {}
    for record in records(log):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            config.update({_key(item): json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            config.update({_key(item): json.loads(item.value_json) for item in record.config.update})
        elif kind == "summary":
            summary.update({_key(item): json.loads(item.value_json) for item in record.summary.update})
    assert run is not None, f"{log} holds no run record"
    return OfflineRun(log.parent, run.run_group, run.job_type, run.display_name, list(run.tags), config, summary)


def logged_table(run: OfflineRun, key: str) -> list[dict[str, Any]]:
    """The rows of the table logged under `key`, from the file the summary points to."""
    table = json.loads((run.directory / "files" / run.summary[f"{key}/path"]).read_text())
    return [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
