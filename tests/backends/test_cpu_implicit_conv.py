"""Convolutions as implicit GEMMs (backends/cpu/kernels/implicit_conv.py,
implicit_weight_grad.py, implicit_weight_grad_blocks.py): forward convs, stride-1 input
gradients and weight gradients against the interpreter on 1, 2 and 4 threads, f32 and f64,
with panels inside an image and across images (and the flat packer's vectors across two
or more images), split across threads."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_ops import attrs, conv_and_gradients

from ember.backends import cpu, interpreter
from ember.backends.cpu.kernels.conv import Conv
from ember.backends.cpu.machine.host import host_isa

CASES = [  # x shape, w shape, stride, padding, dilation, groups
    ((1, 6, 16, 12), (10, 6, 3, 3), [1, 1], [1, 1], [1, 1], 1),  # 3 panels, one a tail
    ((3, 4, 9, 20), (4, 2, 3, 5), [1, 1], [2, 1], [1, 2], 2),   # groups, dilation
    ((2, 16, 18, 18), (8, 16, 3, 3), [2, 2], [1, 1], [1, 1], 1),  # strided: gathers
    ((5, 6, 4, 4), (9, 6, 3, 3), [1, 1], [1, 1], [1, 1], 1),  # panels across images
    ((3, 2, 5, 3), (4, 1, 3, 3), [1, 1], [1, 1], [1, 1], 2),  # ... of 15 positions each
    ((6, 3, 2, 2), (5, 3, 3, 3), [1, 1], [1, 1], [1, 1], 1),  # vectors over 4+ images
    # dW^T of two panels of O, the second short, and transposed by blocks of lanes
    ((2, 16, 6, 6), (80, 16, 3, 3), [1, 1], [1, 1], [1, 1], 1),
    # the input gradient's flip by tiles of 16 x 16 (o, c) pairs, both sides with a tail
    ((2, 20, 5, 5), (40, 20, 3, 3), [1, 1], [1, 1], [1, 1], 1),
]


@pytest.mark.parametrize("threads,chunked", [(1, False), (2, False), (4, False), (2, True)])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("case", CASES)
def test_implicit_conv_and_gradients(case, dtype, threads, chunked, monkeypatch):
    """`chunked`: as if the weights were past L2, so that forward convs pack chunks of
    panels for each read of W, in blocks of its rows (implicit_conv.Units), and weight
    gradients split blocks of dW's input channels across threads
    (implicit_weight_grad_blocks.py); on 2 threads, whose balancing of blocks it checks
    (CI time)."""
    from ember.backends.cpu.kernels import implicit_conv, implicit_weight_grad
    from ember.backends.cpu.parallel import outline

    monkeypatch.setenv("EMBER_NUM_THREADS", str(threads))
    monkeypatch.setattr(outline, "MIN_WORK", 16)  # split even these small convs
    monkeypatch.setattr(implicit_conv, "FLIP_POSITIONS", 1)  # flip even for these few
    if chunked:
        monkeypatch.setattr(implicit_conv, "resident_weight_bytes", lambda: 0)
        monkeypatch.setattr(implicit_conv, "chunk_bytes", lambda: 32 << 10)
        monkeypatch.setattr(implicit_weight_grad, "copied_weight_bytes", lambda: 0)
    xs, ws, stride, pad, dil, groups = case
    a = attrs(stride, pad, dil, groups)
    rng = np.random.default_rng(3)
    x, w = (rng.standard_normal(s).astype(dtype.replace("f", "float")) for s in (xs, ws))

    g = conv_and_gradients(xs, ws, a, dtype)
    conv, grad_x, grad_w = (op for op in g.body.ops if op.name.startswith("ember.conv2d"))
    assert Conv(conv).implicit(host_isa()) and Conv(grad_w).implicit(host_isa())
    assert bool(Conv(grad_x).implicit(host_isa())) == (stride == [1, 1])
    want = interpreter.run(g, [x, w])
    got = cpu.Executable(g, use_cache=False)([x, w])
    tol = 2e-5 if dtype == "f32" else 1e-12
    for gv, wv in zip(got, want):
        np.testing.assert_allclose(gv, wv, rtol=tol, atol=tol * np.abs(wv).max())
