"""Data for training: a numpy batch loader, the scikit-learn digits, and `.npz` files."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass
class Dataset:
    """Arrays of inputs and integer labels, split into train and test."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.x_train.shape[1:]


def split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int) -> tuple:
    """A seeded shuffle then split: the same seed always gives the same split."""
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def digits(seed: int = 0, test_fraction: float = 0.2, image: bool = False) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1797 images), scaled to [0, 1].

    `image=True` gives [N, 1, 8, 8] for convolutional models, else [N, 64].
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    if image:
        x = x.reshape(-1, 1, 8, 8)
    return Dataset(*split(x, d.target.astype(np.int64), test_fraction, seed), num_classes=10)


def load_npz(path: str, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """An `.npz` with arrays `x` and `y` (or `x_train`, `y_train`, `x_test`, `y_test`)."""
    with np.load(path, allow_pickle=False) as f:
        if "x_train" in f:
            parts = [f[k] for k in ("x_train", "y_train", "x_test", "y_test")]
        elif "x" in f and "y" in f:
            parts = split(f["x"], f["y"], test_fraction, seed)
        else:
            raise ValueError(f"{path}: expected arrays 'x' and 'y' (or 'x_train', 'y_train', "
                             f"'x_test', 'y_test'), found {sorted(f.files)}")
    x_tr, y_tr, x_te, y_te = parts
    y_tr, y_te = y_tr.astype(np.int64), y_te.astype(np.int64)
    return Dataset(x_tr.astype(np.float32), y_tr, x_te.astype(np.float32), y_te,
                   num_classes=int(max(y_tr.max(), y_te.max())) + 1)


class DataLoader:
    """Batches of (x, y), reshuffled each epoch from a seeded generator."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, shuffle: bool = True,
                 drop_last: bool = True, seed: int = 0):
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.x, self.y = x, y
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        n, b = len(self.x), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        order = self.rng.permutation(len(self.x)) if self.shuffle else np.arange(len(self.x))
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield np.ascontiguousarray(self.x[idx]), np.ascontiguousarray(self.y[idx])
