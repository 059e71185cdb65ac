"""`python -m dpbench.components [GROUP ...] [--config-dir DIR]`: every name a run accepts, where it comes from,
its keys.

Models, data sets, privatizers and optimizers are listed as `python -m dpbench GROUP=NAME` would compose them (the
same conf dir, presets, entry-point plugins and `--config-dir`), each node merged into the dataclass its component
declares: the keys shown are exactly those `GROUP.KEY=VALUE` accepts, with the values the name gives them.
Experiments and sweeps (`+experiment=NAME`, `+sweep=NAME`) are listed with the first sentence of their description.
"""

from __future__ import annotations

import argparse
import sys

from hydra.core.global_hydra import GlobalHydra

from dpbench.app.catalog import entries, format_group
from dpbench.app.hydra_setup import main_hydra
from dpbench.core.errors import ConfigurationError
from dpbench.core.registry import COMPONENTS, RECIPES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpbench.components", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("groups", nargs="*", metavar="GROUP",
                        help=f"any of {', '.join(COMPONENTS + RECIPES)} (default: all)")
    parser.add_argument("--config-dir", help="your own config directory, as given to `python -m dpbench`")
    args = parser.parse_args(argv)
    unknown = [group for group in args.groups if group not in COMPONENTS + RECIPES]
    if unknown:  # argparse's own choices= refuses an empty nargs="*" list
        parser.error(f"unknown group {', '.join(unknown)}; choose from {', '.join(COMPONENTS + RECIPES)}")
    try:
        hydra = main_hydra(argparse.Namespace(config_path=None, config_dir=args.config_dir))
        for number, group in enumerate(args.groups or COMPONENTS + RECIPES):
            print(("\n" if number else "") + format_group(group, entries(hydra, group)), flush=True)
    except ConfigurationError as error:
        print(f"dpbench.components: error: {error}", file=sys.stderr)
        return 2
    finally:
        GlobalHydra.instance().clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
