"""Data for training: a numpy batch loader, the scikit-learn digits, and `.npz` files."""

from __future__ import annotations

import io
import queue
import threading
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
    data, target = _load_digits()
    x = (data / 16.0).astype(np.float32)
    if image:
        x = x.reshape(-1, 1, 8, 8)
    return Dataset(*split(x, target.astype(np.int64), test_fraction, seed), num_classes=10)


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (data, target). Importing sklearn.datasets takes ~0.8 s, a
    third of `ember train`, so after the first load the arrays are read from a copy in
    ember's cache directory (keyed by scikit-learn's version; `EMBER_CACHE=0`: never)."""
    from importlib.metadata import version

    from ..backends.cpu.cache import enabled
    from ..backends.cpu.cost import cache_dir
    from ..files import write_atomically

    path = cache_dir() / f"digits-scikit-learn-{version('scikit-learn')}.npz"
    if enabled():
        try:
            with np.load(path, allow_pickle=False) as f:
                return f["data"], f["target"]
        except (OSError, KeyError, ValueError):  # none yet, or damaged: load it again
            pass
    from sklearn.datasets import load_digits

    d = load_digits()
    if enabled():
        buf = io.BytesIO()
        np.savez(buf, data=d.data, target=d.target)
        try:
            write_atomically(str(path), buf.getvalue())
        except OSError:  # a read-only cache costs only the time
            pass
    return d.data, d.target


def load_npz(path: str, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """An `.npz` with arrays `x` and `y` (or `x_train`, `y_train`, `x_test`, `y_test`)."""
    with np.load(path, allow_pickle=False) as f:
        if "x_train" in f:
            parts = [f[k] for k in ("x_train", "y_train", "x_test", "y_test")]
            _check(path, "train", *parts[:2])
            _check(path, "test", *parts[2:])
        elif "x" in f and "y" in f:
            _check(path, "", f["x"], f["y"])
            parts = split(f["x"], f["y"], test_fraction, seed)
        else:
            raise ValueError(f"{path}: expected arrays 'x' and 'y' (or 'x_train', 'y_train', "
                             f"'x_test', 'y_test'), found {sorted(f.files)}")
    x_tr, y_tr, x_te, y_te = parts
    y_tr, y_te = y_tr.astype(np.int64), y_te.astype(np.int64)
    return Dataset(x_tr.astype(np.float32), y_tr, x_te.astype(np.float32), y_te,
                   num_classes=int(max(y_tr.max(), y_te.max())) + 1)


def _check(path: str, part: str, x: np.ndarray, y: np.ndarray) -> None:
    """What would otherwise fail deep inside a step: row counts, NaN/Inf, label values."""
    part = f"{part} " if part else ""
    if len(x) != len(y):
        raise ValueError(f"{path}: {part}x has {len(x)} rows but y has {len(y)}")
    if x.dtype.kind not in "fiub":
        raise ValueError(f"{path}: x must be numeric, got dtype {x.dtype}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        rows = np.unique(np.nonzero(~np.isfinite(x.reshape(len(x), -1)))[0])[:5].tolist()
        raise ValueError(f"{path}: {part}x contains NaN or Inf (rows {rows})")
    if y.dtype.kind not in "iu" and not (y.dtype.kind == "f" and np.all(y == np.round(y))):
        raise ValueError(f"{path}: y must hold integer class labels, got dtype {y.dtype}")
    if len(y) and y.min() < 0:
        raise ValueError(f"{path}: {part}y has negative labels ({int(y.min())})")


class _Raised:
    def __init__(self, error: BaseException):
        self.error = error


_END = object()


class DataLoader:
    """Batches of (x, y): seeded shuffling, drop_last, and an optional prefetch thread.

    Epoch `e` is shuffled by `np.random.default_rng([seed, e])`, so the order depends only
    on (seed, epoch): a resumed run (`set_epoch(e, batch)`) sees exactly the batches an
    uninterrupted one would. Each `iter()` serves the next epoch. With `prefetch > 0` a
    thread gathers up to that many batches ahead while the step runs (numpy's fancy
    indexing releases the GIL for large copies). It is off by default, as PyTorch's
    workers are: for arrays in memory a batch takes ~3 us to gather, and handing it over
    between threads cost more (a digits MLP step measured 47 us without, 67-160 with).
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, shuffle: bool = True,
                 drop_last: bool = True, seed: int = 0, prefetch: int = 0):
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if drop_last and len(x) < batch_size:
            raise ValueError(f"batch_size {batch_size} is larger than the data ({len(x)} rows) "
                             "and drop_last is set: no batch would be served")
        self.x, self.y = x, y
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.seed, self.prefetch = seed, prefetch
        self.epoch, self.start = 0, 0  # what the next iter() serves: epoch, first batch

    def __len__(self) -> int:
        n, b = len(self.x), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def set_epoch(self, epoch: int, batch: int = 0) -> None:
        """The next iter() serves `epoch` (0-based), starting at its batch `batch`."""
        self.epoch, self.start = int(epoch), int(batch)

    def order(self, epoch: int) -> np.ndarray:
        n = len(self.x)
        return np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle \
            else np.arange(n)

    def _batches(self, order: np.ndarray, start: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for i in range(start, len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield np.ascontiguousarray(self.x[idx]), np.ascontiguousarray(self.y[idx])

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        batches = self._batches(self.order(self.epoch), self.start)
        self.epoch, self.start = self.epoch + 1, 0
        return _prefetched(batches, self.prefetch) if self.prefetch > 0 else batches


def _prefetched(it: Iterator, depth: int) -> Iterator:
    """`it` run on a daemon thread, up to `depth` items ahead; stops when the consumer does."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in it:
                if not put(item):
                    return
            put(_END)
        except BaseException as e:  # noqa: BLE001  (handed to the consumer)
            put(_Raised(e))

    thread = threading.Thread(target=work, name="ember-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, _Raised):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()
