"""The DataLoader: seeded per-epoch shuffling, resuming mid-epoch, background prefetch."""

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


def test_bad_data_is_rejected_clearly(tmp_path):
    x, y = arrays()
    with pytest.raises(ValueError, match="x has 103 rows but y has 100"):
        DataLoader(x, y[:100], 10)
    with pytest.raises(ValueError, match="larger than the data"):
        DataLoader(x, y, 500)
    np.savez(tmp_path / "bad.npz", x=x, y=y[:100])
    with pytest.raises(ValueError, match="103 rows but y has 100"):
        load_npz(str(tmp_path / "bad.npz"))
    x[7, 1] = np.inf
    np.savez(tmp_path / "inf.npz", x=x, y=y)
    with pytest.raises(ValueError, match=r"x contains NaN or Inf \(rows \[7\]\)"):
        load_npz(str(tmp_path / "inf.npz"))
    np.savez(tmp_path / "neg.npz", x=x[:3] * 0, y=np.array([0, -1, 2]))
    with pytest.raises(ValueError, match="negative labels"):
        load_npz(str(tmp_path / "neg.npz"))
    np.savez(tmp_path / "other.npz", a=x)
    with pytest.raises(ValueError, match="expected arrays 'x' and 'y'"):
        load_npz(str(tmp_path / "other.npz"))


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
