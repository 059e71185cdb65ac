"""A small copy of the real Fashion-MNIST (Debian's dataset-fashion-mnist) for the recipes' tests; the
`small_fashion_mnist` fixture in tests/conftest.py makes one."""

import gzip
import math
from pathlib import Path

import pytest

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def idx_subset(source: Path, target: Path, count: int) -> None:
    """The first `count` records of an IDX file (gzip), in the same format."""
    with gzip.open(source, "rb") as handle:
        data = handle.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    record = math.prod(shape[1:])
    header = data[:4] + count.to_bytes(4, "big") + data[8 : 4 + 4 * dims]
    with gzip.open(target, "wb") as handle:
        handle.write(header + data[4 + 4 * dims : 4 + 4 * dims + count * record])


def small_fashion_mnist(folder: Path) -> Path:
    """512 training and 256 test images of the real Fashion-MNIST in `folder`, in the Debian package's layout;
    the calling test is skipped when the package is not installed."""
    if not (FASHION_MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("Fashion-MNIST not installed: apt-get install dataset-fashion-mnist")
    folder.mkdir()
    for split, count in (("train", 512), ("t10k", 256)):
        for kind in ("images-idx3", "labels-idx1"):
            name = f"{split}-{kind}-ubyte.gz"
            idx_subset(FASHION_MNIST / name, folder / name, count)
    return folder
