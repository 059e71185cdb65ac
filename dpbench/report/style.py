"""One colour and marker per method, keyed by its label (dpbench.methods.method_label): DP-SGD looks the same in
every figure of every report, whatever else a sweep holds, so figures can be read side by side."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from matplotlib import colormaps

from dpbench.methods import METHODS, OPTIMIZERS, method_label

COLOURS = [colormaps["tab10"](i) for i in range(10)]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h"]  # 9 markers and 10 colours: 90 distinct pairs
# The methods compared most often come first, so they get ten different colours (and markers).
FIRST = [("vanilla", "sgd"), ("vanilla", "adam"), ("nonprivate", "sgd"), ("nonprivate", "adam"), ("grape", "adam"),
         ("d2p2", "sgd"), ("jl", "sgd"), ("sparse", "sgd"), ("dp_galore", "adam"), ("d2p_sgd", "sgd")]


@dataclass(frozen=True)
class Style:
    colour: tuple[float, ...]
    marker: str


def _known() -> list[str]:
    labels = [method_label(p, o) for p, o in FIRST]
    labels += [method_label(p, o) for p in METHODS for o in OPTIMIZERS]
    return list(dict.fromkeys(labels))


def _style(index: int) -> Style:
    return Style(COLOURS[index % len(COLOURS)], MARKERS[index % len(MARKERS)])


STYLES = {label: _style(index) for index, label in enumerate(_known())}


def style_of(method: str) -> Style:
    """The method's style; a plugin's method gets one derived from its label (stable across runs and reports)."""
    return STYLES.get(method) or _style(len(STYLES) + zlib.crc32(method.encode()))
