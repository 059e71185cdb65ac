"""python -m dpbench.profile max_batch [--cap-mb MB] [--privatizers a,b] [hydra overrides ...]

Finds, for each privatizer, the largest batch that trains under the memory cap; writes max_batch.json (read by
`python -m dpbench.report`: the results, and what each memory field means) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hydra.errors import HydraException

from dpbench.errors import ConfigurationError
from dpbench.profiling.max_batch import MEMORY_FIELDS, find_max_batch

MAX_BATCH_FILE = "max_batch.json"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m dpbench.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["max_batch"])
    parser.add_argument("--cap-mb", type=float, required=True, help="memory cap in MB (CPU: resident; CUDA: device)")
    parser.add_argument("--privatizers", default="nonprivate,vanilla", help="comma-separated privatizer configs")
    parser.add_argument("--start", type=int, default=8)
    parser.add_argument("--limit", type=int, default=1 << 16)
    parser.add_argument("--out", type=Path, default=Path("outputs/max_batch"))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=cnn_large data=mnist5k")
    args = parser.parse_intermixed_args()
    rows = []
    try:
        for privatizer in args.privatizers.split(","):
            print(f"{privatizer}:", flush=True)
            result = find_max_batch([*args.overrides, f"privatizer={privatizer}"], args.cap_mb, args.start,
                                    args.limit)
            rows.append({"privatizer": privatizer, **result.to_dict()})
    except (ConfigurationError, HydraException) as error:  # a cap that cannot work, or an override Hydra refuses
        print(f"dpbench.profile: error: {error}", file=sys.stderr)
        sys.exit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / MAX_BATCH_FILE).write_text(json.dumps({"memory_fields_mb": MEMORY_FIELDS, "results": rows},
                                                      indent=2))
    print(f"\nlargest batch under {args.cap_mb:g} MB ({rows[0]['device']}: {rows[0]['cap_applies_to']}):")
    for row in rows:
        print(f"  {row['privatizer']:>20}: {row['max_batch_size']}" + (f"  ({row['note']})" if row["note"] else ""))
    print(f"wrote {args.out / MAX_BATCH_FILE}")


if __name__ == "__main__":
    main()
