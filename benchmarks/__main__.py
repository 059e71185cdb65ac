"""`make bench`: every benchmark in turn (or those named), each comparing its configurations side by side.

    python -m benchmarks                 # all
    python -m benchmarks vanilla_cnn     # one
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ["vanilla_cnn", "grape_vit", "jl_lstm", "d2p2", "sparse_word2vec", "per_sample_checks", "overhead",
              "mixed_precision"]


def main() -> None:
    names = [a for a in sys.argv[1:] if a in BENCHMARKS] or BENCHMARKS
    sys.argv = [sys.argv[0], *[a for a in sys.argv[1:] if a not in BENCHMARKS]]
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        importlib.import_module(f"benchmarks.{name}").main()


if __name__ == "__main__":
    main()
