"""The DataLoader (seeded per-epoch shuffling, resuming mid-epoch, background prefetch),
`.npz` files and the digits: bad or damaged data is a clear error or is loaded again."""

import io
import threading

import numpy as np
import pytest

from ember.runtime.data import DataLoader, digits, load_npz


def arrays(n=103):
    return np.arange(n * 2, dtype=np.float32).reshape(n, 2), np.arange(n)


def epoch(loader):
    return [y.tolist() for _, y in loader]


def test_prefetch_serves_exactly_the_batches_of_a_plain_loop():
    x, y = arrays()
    plain, fetched = DataLoader(x, y, 10, seed=3), DataLoader(x, y, 10, seed=3, prefetch=2)
    for _ in range(3):
        assert epoch(plain) == epoch(fetched)
    for xb, yb in DataLoader(x, y, 10, seed=3, prefetch=2):
        np.testing.assert_array_equal(xb[:, 0] / 2, yb)  # rows stay paired
        assert xb.flags.c_contiguous


def test_shuffling_depends_only_on_seed_and_epoch():
    x, y = arrays()
    a = DataLoader(x, y, 10, seed=1)
    first, second = epoch(a), epoch(a)
    assert first != second and len(first) == 10 and all(len(b) == 10 for b in first)
    b = DataLoader(x, y, 10, seed=1)
    b.set_epoch(1, batch=4)
    assert epoch(b) == second[4:]
    assert epoch(DataLoader(x, y, 10, seed=2)) != first
    assert sorted(sum(epoch(DataLoader(x, y, 10, drop_last=False)), [])) == list(range(103))
    assert epoch(DataLoader(x, y, 10, shuffle=False))[0] == list(range(10))


def test_stopping_early_ends_the_prefetch_thread():
    x, y = arrays(1000)
    before = threading.active_count()
    for i, _ in enumerate(DataLoader(x, y, 10, prefetch=2)):
        if i == 3:
            break
    assert threading.active_count() == before


@pytest.mark.parametrize("prefetch", [0, 2])
def test_an_error_in_the_loader_reaches_the_consumer(prefetch):
    class Bad(np.ndarray):
        def __getitem__(self, idx):
            raise MemoryError("no room")

    x, y = arrays()
    with pytest.raises(MemoryError, match="no room"):
        list(DataLoader(x.view(Bad), y, 10, prefetch=prefetch))


def test_bad_loader_arguments_are_rejected_clearly():
    x, y = arrays()
    with pytest.raises(ValueError, match="x has 103 rows but y has 100"):
        DataLoader(x, y[:100], 10)
    with pytest.raises(ValueError, match="larger than the data"):
        DataLoader(x, y, 500)


def npz(**named) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **named)
    return buf.getvalue()


def flip(data: bytes, i: int) -> bytes:
    b = bytearray(data)
    b[i] ^= 0x40
    return bytes(b)


X, Y = arrays(20)
X_INF = X.copy()
X_INF[7, 1] = np.inf
X_BIG = X.astype(np.float64)
X_BIG[3, 0] = 1e39  # Inf as float32
NPY = io.BytesIO()
np.save(NPY, X)
# what lands in the file, and what the error must say after "<file>: "
BAD_NPZ = {
    "truncated": (npz(x=X, y=Y)[:300], "cannot read it as an .npz of plain arrays"),
    "not an npz": (b"x,y\n1,2\n", "cannot read it as an .npz of plain arrays"),
    "a bare npy": (NPY.getvalue(), "it holds a single .npy array"),
    "object arrays": (npz(x=np.array([{}, 1], dtype=object), y=Y[:2]), "Object arrays"),
    "no x and y": (npz(a=X), "expected arrays 'x' and 'y'"),
    "no y_test": (npz(x_train=X, y_train=Y, x_test=X), "found ['x_test', 'x_train', 'y_train']"),
    "x of one dim": (npz(x=Y.astype(np.float32), y=Y), "x must be [rows, features...]"),
    "y of two dims": (npz(x=X, y=Y.reshape(20, 1)), "y must be a vector of class labels"),
    "rows differ": (npz(x=X, y=Y[:17]), "x has 20 rows but y has 17"),
    "no rows": (npz(x=X[:0], y=Y[:0]), "x and y have no rows"),
    "too few rows to split": (npz(x=X[:2], y=Y[:2]), "2 rows are too few"),
    "text x": (npz(x=X.astype(str), y=Y), "x must be numeric, got dtype <U"),
    "inf in x": (npz(x=X_INF, y=Y), r"x contains NaN or Inf (rows [7])"),
    "nan in test x": (npz(x_train=X, y_train=Y, x_test=X * np.nan, y_test=Y),
                      "test x contains NaN or Inf (rows [0, 1, 2, 3, 4])"),
    "beyond float32": (npz(x=X_BIG, y=Y), "x contains NaN or Inf (rows [3])"),
    "features differ": (npz(x_train=X, y_train=Y, x_test=X[:, :1], y_test=Y),
                        "x_train rows have shape (2,) but x_test rows (1,)"),
    "negative label": (npz(x=X[:5], y=np.array([0, -1, 2, 1, 0])), "y has negative labels (-1)"),
    "a label of 10**12": (npz(x=X, y=np.where(Y == 3, 10**12, Y)),
                          "y has label 1000000000000: class labels must be 0..99999"),
    "fractional labels": (npz(x=X, y=Y + 0.5), "whole-number class labels, got 0.5"),
    "nan label": (npz(x=X, y=np.where(Y == 3, np.nan, Y)), "whole-number class labels, got nan"),
    "text labels": (npz(x=X, y=Y.astype(str)), "y must hold integer class labels, got dtype <U"),
}


@pytest.mark.parametrize("case", BAD_NPZ)
def test_a_bad_npz_is_a_value_error_naming_the_file_and_the_fault(case, tmp_path):
    content, message = BAD_NPZ[case]
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(ValueError) as e:
        load_npz(str(path))
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value), str(e.value)


def test_npz_labels_become_class_ids_and_x_float32(tmp_path):
    np.savez(tmp_path / "xy.npz", x=X.astype(np.float64), y=(Y % 4).astype(np.float64))
    d = load_npz(str(tmp_path / "xy.npz"))
    assert d.num_classes == 4 and d.y_train.dtype == np.int64 and d.x_train.dtype == np.float32
    assert len(d.x_train) == 16 and len(d.x_test) == 4 and d.input_shape == (2,)
    np.savez(tmp_path / "split.npz", x_train=X, y_train=Y.astype(np.uint8) % 3,
             x_test=X[:2], y_test=np.array([6, 0]))
    d = load_npz(str(tmp_path / "split.npz"))
    assert d.num_classes == 7 and len(d.x_train) == 20 and d.y_test.tolist() == [6, 0]


def test_digits_split_is_seeded_and_shaped_for_both_models():
    a, b = digits(seed=0), digits(seed=0, image=True)
    assert a.x_train.shape[1:] == (64,) and b.x_train.shape[1:] == (1, 8, 8)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.y_test, digits(seed=1).y_test)


def test_digits_are_read_from_a_cached_copy_after_the_first_load(tmp_path, monkeypatch):
    """The copy in the cache directory holds scikit-learn's arrays exactly; a damaged copy
    is loaded again from scikit-learn and rewritten; EMBER_CACHE=0 writes nothing."""
    from sklearn.datasets import load_digits

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_CACHE", "0")
    first = digits(seed=3)
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv("EMBER_CACHE", "1")
    digits(seed=3)
    (copy,) = tmp_path.glob("digits-scikit-learn-*.npz")
    with np.load(copy, allow_pickle=False) as f:
        np.testing.assert_array_equal(f["data"], load_digits().data)
        np.testing.assert_array_equal(f["target"], load_digits().target)
    cached = digits(seed=3)
    np.testing.assert_array_equal(cached.x_train, first.x_train)
    np.testing.assert_array_equal(cached.y_test, first.y_test)
    copy.write_bytes(b"not an npz")
    np.testing.assert_array_equal(digits(seed=3).x_test, first.x_test)
    with np.load(copy, allow_pickle=False) as f:
        assert f["data"].shape == (1797, 64)


DIGITS_DAMAGES = {
    "empty": lambda good, d: b"",
    "cut in half": lambda good, d: good[:len(good) // 2],
    "a flipped pixel byte": lambda good, d: flip(good, len(good) // 2),  # fails the zip CRC
    "other arrays": lambda good, d: npz(x=d.data, y=d.target),
    "too few images": lambda good, d: npz(data=d.data[:100], target=d.target[:100]),
    "pixels as text": lambda good, d: npz(data=d.data.astype(str), target=d.target),
    "pixels beyond 16": lambda good, d: npz(data=d.data * 2, target=d.target),
    "labels beyond 9": lambda good, d: npz(data=d.data, target=d.target + 10),
    "float labels": lambda good, d: npz(data=d.data, target=d.target + 0.5),
}


@pytest.mark.parametrize("damage", DIGITS_DAMAGES)
def test_a_damaged_digits_copy_is_loaded_again_and_rewritten(damage, tmp_path, monkeypatch):
    from sklearn.datasets import load_digits

    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_CACHE", "1")
    want = digits(seed=3)
    (copy,) = tmp_path.glob("digits-scikit-learn-*.npz")
    ref = load_digits()
    copy.write_bytes(DIGITS_DAMAGES[damage](copy.read_bytes(), ref))
    got = digits(seed=3)
    np.testing.assert_array_equal(got.x_train, want.x_train)
    np.testing.assert_array_equal(got.y_test, want.y_test)
    with np.load(copy, allow_pickle=False) as f:
        np.testing.assert_array_equal(f["data"], ref.data)
        np.testing.assert_array_equal(f["target"], ref.target)


def test_uint8_pixels_are_scaled_to_0_1_with_a_note(tmp_path, capsys):
    path = tmp_path / "pixels.npz"
    np.savez(path, x=np.full((50, 64), 255, np.uint8), y=np.arange(50) % 10)
    ds = load_npz(str(path))
    assert ds.x_train.dtype == np.float32 and ds.x_train.max() == 1.0
    assert "x is uint8: scaled to [0, 1]" in capsys.readouterr().err
