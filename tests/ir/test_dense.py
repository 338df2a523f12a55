"""Dense attribute helpers: a splat is found and keyed by its one element, so that a huge
splat (a broadcast view, as the parser keeps it) is never materialized."""

from __future__ import annotations

import numpy as np

from ember.ir.dense import dense_key, splat_element

HUGE = (100_000, 100_000)  # 40 GB of f32 if it were materialized


def test_a_broadcast_view_is_a_splat_without_reading_it():
    a = np.broadcast_to(np.float32(1.5), HUGE)
    assert splat_element(a) == np.float32(1.5)
    assert dense_key(a) == dense_key(np.broadcast_to(np.float32(1.5), HUGE))
    assert dense_key(a) != dense_key(np.broadcast_to(np.float32(2.5), HUGE))
    assert dense_key(np.broadcast_to(np.float32(1.5), (3, 4))) == \
        dense_key(np.full((3, 4), 1.5, np.float32))


def test_splats_compare_by_bits():
    assert splat_element(np.array([0.0, -0.0])) is None
    assert np.isnan(splat_element(np.full(3, np.nan)))
    assert splat_element(np.array([], np.float32)) is None
    assert splat_element(np.array([[2, 2], [2, 2]], np.int32)) == 2


def test_keys_tell_dtype_shape_and_elements_apart():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert dense_key(a) == dense_key(a.copy())
    assert dense_key(a) != dense_key(a.reshape(3, 2))
    assert dense_key(a) != dense_key(a.astype(np.float64))
    assert dense_key(np.ones(4, np.float32)) == dense_key(np.broadcast_to(np.float32(1), (4,)))
    assert dense_key(np.ones(4, np.float32)) != dense_key(np.ones(4, np.float32) * 2)
