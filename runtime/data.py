"""Data for training: a numpy batch loader, the scikit-learn digits, and `.npz` files."""

from __future__ import annotations

import io
import queue
import sys
import threading
import zipfile
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
    ember's cache directory (keyed by scikit-learn's version; `EMBER_CACHE=0`: never). A
    copy that is damaged or not what scikit-learn gives is loaded again and rewritten."""
    from importlib.metadata import version

    from ..files import cache_dir, cache_enabled, write_atomically

    path = cache_dir() / f"digits-scikit-learn-{version('scikit-learn')}.npz"
    if cache_enabled():
        cached = _cached_digits(str(path))
        if cached is not None:
            return cached
    from sklearn.datasets import load_digits

    d = load_digits()
    if cache_enabled():
        buf = io.BytesIO()
        np.savez(buf, data=d.data, target=d.target)
        try:
            write_atomically(str(path), buf.getvalue())
        except OSError:  # a read-only cache costs only the time
            pass
    return d.data, d.target


def _cached_digits(path: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The cached (data, target) if the copy holds what scikit-learn's digits are: 1797
    images of 64 pixels in 0..16, labels 0..9. None if it is missing or anything is off."""
    try:
        arrays = _read_npz(path)
    except (OSError, ValueError):
        return None
    data, target = arrays.get("data"), arrays.get("target")
    if data is None or target is None or data.shape != (1797, 64) or data.dtype.kind != "f" \
            or target.shape != (1797,) or target.dtype.kind not in "iu":
        return None
    if not (((data >= 0) & (data <= 16)).all() and ((target >= 0) & (target <= 9)).all()):
        return None
    return data, target


# np.load's errors for a cut or damaged archive (fuzzed: every truncation, every byte flipped)
_DAMAGED_NPZ = (ValueError, EOFError, zipfile.BadZipFile, NotImplementedError, RuntimeError)


def _read_npz(path: str) -> dict[str, np.ndarray]:
    """Every array of an `.npz`, read now (a damaged member fails its CRC here, not later);
    ValueError naming the file when it is not a readable `.npz` of plain arrays."""
    try:
        loaded = np.load(path, allow_pickle=False)  # a pickle never runs: no object arrays
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("it holds a single .npy array")
        with loaded:
            return {k: loaded[k] for k in loaded.files}
    except _DAMAGED_NPZ as e:
        raise ValueError(f"{path}: cannot read it as an .npz of plain arrays ({e})") from None


MAX_CLASSES = 100_000  # a label is a class id: one of 10**12 would size a 10**12-wide one-hot
_SPLIT = ("x_train", "y_train", "x_test", "y_test")


def load_npz(path: str, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """An `.npz` with arrays `x` and `y` (or `x_train`, `y_train`, `x_test`, `y_test`):
    x numeric with one example per row, y class ids 0..MAX_CLASSES-1. Anything else is a
    ValueError that names the file and what is wrong with it."""
    arrays = _read_npz(path)
    if set(_SPLIT) <= arrays.keys():
        x_tr, y_tr = _checked(path, "train ", arrays["x_train"], arrays["y_train"])
        x_te, y_te = _checked(path, "test ", arrays["x_test"], arrays["y_test"])
        if x_tr.shape[1:] != x_te.shape[1:]:
            raise ValueError(f"{path}: x_train rows have shape {x_tr.shape[1:]} but x_test "
                             f"rows {x_te.shape[1:]}")
    elif {"x", "y"} <= arrays.keys():
        x, y = _checked(path, "", arrays["x"], arrays["y"])
        x_tr, y_tr, x_te, y_te = split(x, y, test_fraction, seed)
        if not len(x_tr) or not len(x_te):
            raise ValueError(f"{path}: {len(x)} rows are too few to hold out a test fraction "
                             f"of {test_fraction}")
    else:
        raise ValueError(f"{path}: expected arrays 'x' and 'y' (or 'x_train', 'y_train', "
                         f"'x_test', 'y_test'), found {sorted(arrays)}")
    return Dataset(x_tr, y_tr, x_te, y_te, num_classes=int(max(y_tr.max(), y_te.max())) + 1)


def _checked(path: str, part: str, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x as float32, y as int64) after checking what would otherwise fail deep inside a
    step: shapes, row counts, dtypes, NaN/Inf, label values."""
    where = f"{path}: {part}"
    if x.ndim < 2 or 0 in x.shape[1:]:
        raise ValueError(f"{where}x must be [rows, features...] with at least one feature, "
                         f"got shape {x.shape}")
    if y.ndim != 1:
        raise ValueError(f"{where}y must be a vector of class labels, got shape {y.shape}")
    if len(x) != len(y):
        raise ValueError(f"{where}x has {len(x)} rows but y has {len(y)}")
    if not len(x):
        raise ValueError(f"{where}x and y have no rows")
    if x.dtype.kind not in "fiub":
        raise ValueError(f"{where}x must be numeric, got dtype {x.dtype}")
    if x.dtype == np.uint8:  # raw pixels (0..255 trains to chance): as torchvision's ToTensor
        print(f"note: {where}x is uint8: scaled to [0, 1] (x / 255)", file=sys.stderr)
        x = x / np.float32(255)
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes Inf
        x = x.astype(np.float32, copy=False)
    bad = ~np.isfinite(x.reshape(len(x), -1))
    if bad.any():
        rows = np.unique(np.nonzero(bad)[0])[:5].tolist()
        raise ValueError(f"{where}x contains NaN or Inf (rows {rows})")
    return x, _labels(where, y)


def _labels(where: str, y: np.ndarray) -> np.ndarray:
    """y as int64 class ids; whole-number floats (labels saved as float64) are accepted."""
    if y.dtype.kind == "f":
        fractional = y[~(np.isfinite(y) & (y == np.round(y)))]
        if len(fractional):
            raise ValueError(f"{where}y must hold whole-number class labels, got "
                             f"{fractional[0]} (dtype {y.dtype})")
    elif y.dtype.kind not in "iu":
        raise ValueError(f"{where}y must hold integer class labels, got dtype {y.dtype}")
    if y.min() < 0:
        raise ValueError(f"{where}y has negative labels ({y.min()})")
    if y.max() >= MAX_CLASSES:
        raise ValueError(f"{where}y has label {y.max()}: class labels must be 0..{MAX_CLASSES - 1}")
    return y.astype(np.int64, copy=False)


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

    Data-parallel: with `rank` and `world_size`, each epoch's order is cut into global
    batches of `batch_size * world_size` rows (`batch_size` is per rank, as with PyTorch's
    DistributedSampler) and this rank serves its `rank`-th part of each, so the ranks see
    disjoint shards of equal size, and together exactly what one process with the global
    batch size would see. Without drop_last, the order is first padded with its own head
    to a multiple of `world_size` (as DistributedSampler does), so the last batches agree
    in size too.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, shuffle: bool = True,
                 drop_last: bool = True, seed: int = 0, prefetch: int = 0,
                 rank: int = 0, world_size: int = 1):
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if drop_last and len(x) < batch_size * world_size:
            across = f" x {world_size} ranks" if world_size > 1 else ""
            raise ValueError(f"batch_size {batch_size}{across} is larger than the data "
                             f"({len(x)} rows) and drop_last is set: no batch would be served")
        self.x, self.y = x, y
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.seed, self.prefetch = seed, prefetch
        self.rank, self.world_size = rank, world_size
        self.epoch, self.start = 0, 0  # what the next iter() serves: epoch, first batch

    def __len__(self) -> int:
        n, b = self._rows(), self.batch_size * self.world_size
        return n // b if self.drop_last else -(-n // b)

    def _rows(self) -> int:
        """Rows in an epoch's order: padded to a multiple of world_size without drop_last."""
        n, w = len(self.x), self.world_size
        return n if self.drop_last else -(-n // w) * w

    def set_epoch(self, epoch: int, batch: int = 0) -> None:
        """The next iter() serves `epoch` (0-based), starting at its batch `batch`."""
        self.epoch, self.start = int(epoch), int(batch)

    def order(self, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s order of all rows (every rank's): a function of (seed, epoch)."""
        n = len(self.x)
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle \
            else np.arange(n)
        pad = self._rows() - n
        return np.concatenate([order, np.resize(order, pad)]) if pad else order

    def _batches(self, order: np.ndarray, start: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        step = self.batch_size * self.world_size
        for i in range(start, len(self)):
            rows = order[i * step:(i + 1) * step]
            part = len(rows) // self.world_size
            idx = rows[self.rank * part:(self.rank + 1) * part]
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
