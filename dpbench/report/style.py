"""One colour and marker per method, keyed by its label (dpbench.core.methods.method_label): DP-SGD looks the same in
every figure of every report, whatever else a sweep holds, so figures can be read side by side."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from matplotlib import colormaps

from dpbench.core.methods import METHODS, OPTIMIZERS, method_label

COLOURS = [colormaps["tab20"](2 * i) for i in range(10)] + [colormaps["tab20"](2 * i + 1) for i in range(10)]
"""tab10's ten colours (tab20's dark ones), then their light pairs: twenty colours, the first ten as before."""
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h"]  # 9 markers and 20 colours: 180 distinct pairs
# The methods compared most often come first, so they get different colours (and markers): the leaderboard's ViT
# task alone shows twelve methods.
FIRST = [("vanilla", "sgd"), ("vanilla", "adam"), ("nonprivate", "sgd"), ("nonprivate", "adam"), ("grape", "adam"),
         ("d2p2", "sgd"), ("jl", "sgd"), ("sparse", "sgd"), ("dp_galore", "adam"), ("d2p_sgd", "sgd"),
         ("jl", "adam"), ("sparse", "adam"), ("dp2_sgd", "sgd")]


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
    """The method's style; a variant of a known method ("DP-Adam-JL (r=10)", "DP2-SGD (constant noise)") keeps its
    colour with another marker, and a plugin's method gets one derived from its label (stable across runs and
    reports)."""
    if method in STYLES:
        return STYLES[method]
    base, _, variant = method.partition(" (")
    if variant and base in STYLES:
        own = MARKERS.index(STYLES[base].marker)
        shift = 1 + zlib.crc32(variant.encode()) % (len(MARKERS) - 1)
        return Style(STYLES[base].colour, MARKERS[(own + shift) % len(MARKERS)])
    return _style(len(STYLES) + zlib.crc32(method.encode()))
