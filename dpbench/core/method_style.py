"""One colour and marker per method label (dpbench.core.methods.method_label), the same in every figure: the sweep
report's, the leaderboard's and the memory frontier's. A style is a function of the label alone, never of which other
methods share the figure, so figures read side by side and across runs.

A method (DP-SGD, DP-Adam-JL, D2P2-SGD, ...) owns a hue; each of its variants ("DP-Adam-JL (r=10)", "D2P2-SGD
(p = 0.3 d)") is a lighter or darker shade of that hue with a marker of its own, so a variant reads as its method's
kin and never as its twin. Plain RGB tuples: this module imports no plotting library, so any layer's figure (the
frontier's sits below the reports) may use it, and its legend's rows (LEGEND_ROWS).
"""

from __future__ import annotations

import colorsys
import math
import zlib
from dataclasses import dataclass

from dpbench.core.methods import METHODS, OPTIMIZERS, method_label

Colour = tuple[float, float, float]

HUES = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
        "#17becf", "#1b1f5e", "#005f56", "#d4a017")
"""tab10's ten colours, then navy, dark teal and gold: thirteen hues for the thirteen methods compared most."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "p", "<", ">", "H", "8")
"""Fourteen markers against thirteen hues: the thirteen methods compared most each have a marker of their own (a
figure read in grey or by a colour-blind reader still tells them apart), and the first 182 methods each get their
own (hue, marker) pair."""
LIGHTNESS = (0.3, 0.7, 0.5, 0.8, 0.4, 0.6)
"""A variant's lightness (HLS) in its method's hue and saturation, dark and light in turn."""
APART = 0.12
"""How far a variant's lightness stays from its method's own, so that the two never look alike."""
LIGHTNESS_RANGE = (0.25, 0.85)
"""No variant so dark that its hue is lost to black, nor so pale that it vanishes on white."""

FIRST = [("vanilla", "sgd"), ("vanilla", "adam"), ("nonprivate", "sgd"), ("nonprivate", "adam"), ("grape", "adam"),
         ("d2p2", "sgd"), ("jl", "sgd"), ("sparse", "sgd"), ("dp_galore", "adam"), ("d2p_sgd", "sgd"),
         ("jl", "adam"), ("sparse", "adam"), ("dp2_sgd", "sgd")]
"""The methods compared most often come first, so that each gets a hue of its own (the ViT task alone shows twelve
methods and rungs)."""
VARIANTS = ("r=2", "r=10", "r=1", "r=5", "r=30", "r=3", "p = 0.3 d", "constant noise, p = 0.3 d",
            "materialized per-sample gradients", "ghost norms", "paper's S2, sparsity", "LoRA, rank 8")
"""Variants the leaderboard and the frontier show, in a fixed order: each takes the next lightness, so the variants
of one method shown together (JL's rungs, D2P2's and DP2's projections) never share a colour and the two usually
shown side by side (r=2 and r=10) are one dark, one light. A variant not listed gets its place from its text's
checksum."""
NAMES = {"D2P-SGD (no projection)": "D2P-SGD", "DP2-SGD (constant noise)": "DP2-SGD",
         "DP-LoRA (Adam, rank 8)": "DP-Adam (LoRA, rank 8)"}
"""Labels the leaderboard's suite gives a method in words: the same method as in a sweep report, the same style
(DP-LoRA is DP-Adam on adapters: a shade of DP-Adam's hue)."""

LEGEND_ROWS = 10
"""Entries a legend column holds in every figure: a longer legend is split into columns."""


def legend_columns(entries: int) -> int:
    """Columns for a legend of `entries`, each of at most LEGEND_ROWS rows."""
    return max(1, math.ceil(entries / LEGEND_ROWS))


@dataclass(frozen=True)
class Style:
    colour: Colour
    marker: str


def _rgb(hex_colour: str) -> Colour:
    return tuple(int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))  # type: ignore[return-value]


def _shade(colour: Colour, lightness: float) -> Colour:
    """The colour at another lightness, hue and saturation kept (a variant keeps its method's look), at least APART
    from the colour's own lightness."""
    hue, own, saturation = colorsys.rgb_to_hls(*colour)
    darkest, palest = LIGHTNESS_RANGE
    if abs(lightness - own) < APART:
        lightness = own - APART if lightness < own and own - APART >= darkest else own + APART
    return colorsys.hls_to_rgb(hue, min(max(lightness, darkest), palest), saturation)


def _known() -> list[str]:
    labels = [method_label(p, o) for p, o in FIRST]
    labels += [method_label(p, o) for p in METHODS for o in OPTIMIZERS]
    return list(dict.fromkeys(labels))


def _base_style(index: int) -> Style:
    return Style(_rgb(HUES[index % len(HUES)]), MARKERS[index % len(MARKERS)])


BASES = {label: _base_style(index) for index, label in enumerate(_known())}
PAIRS = math.lcm(len(HUES), len(MARKERS))
"""Distinct (hue, marker) pairs: a plugin's method takes one no known method has."""


def _family(label: str) -> tuple[str, str] | None:
    """(method, variant) for "method (variant)", the longest known method first: "DP-GRAPE (Adam) (rank=8)" is a
    variant of "DP-GRAPE (Adam)"."""
    for base in sorted(BASES, key=len, reverse=True):
        if label.startswith(f"{base} (") and label.endswith(")"):
            return base, label[len(base) + 2:-1]
    return None


def _slot(variant: str) -> int:
    """1, 2, ... for the listed variants in order; past them for any other, from its text's checksum."""
    if variant in VARIANTS:
        return 1 + VARIANTS.index(variant)
    return 1 + len(VARIANTS) + zlib.crc32(variant.encode()) % 997


def style_of(label: str) -> Style:
    """The label's style: a known method's own, a variant's shade of its method's hue with another marker, and a
    plugin's method one derived from its label (stable across runs and reports)."""
    label = NAMES.get(label, label)
    if label in BASES:
        return BASES[label]
    family = _family(label)
    if family is None:
        return _base_style(len(BASES) + zlib.crc32(label.encode()) % (PAIRS - len(BASES)))
    base, variant = BASES[family[0]], _slot(family[1])
    shift = 1 + (variant - 1) % (len(MARKERS) - 1)  # never the method's own marker
    marker = MARKERS[(MARKERS.index(base.marker) + shift) % len(MARKERS)]
    return Style(_shade(base.colour, LIGHTNESS[(variant - 1) % len(LIGHTNESS)]), marker)
