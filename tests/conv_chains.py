"""IR graphs of conv chains, built in code, that the layout pass's tests and the cpu's
share (tests/passes/test_layout.py, tests/backends/test_cpu_depthwise_nhwc.py)."""

from __future__ import annotations

import numpy as np
from fused_checks import graph

CONV = dict(dilation=[1, 1])


def conv(b, x, w, stride=1, pad=0, groups=1):
    return b.op("ember.conv2d", x, w, stride=[stride] * 2, padding=[pad] * 2, groups=groups,
                **CONV)


def relu6(b, v):
    six = b.op("ember.constant", value=np.array(6.0, np.float32))
    zero = b.op("ember.constant", value=np.array(0.0, np.float32))
    return b.op("ember.min", b.op("ember.max", v, zero), six)


def mobilenet(n: int, c: int, h: int):
    """A stem conv, then two inverted residual blocks (the second with a residual add and
    a per-image scale, as a squeeze-excite gives), paddings symmetric and at the end."""
    e = 2 * c

    def fn(b, x, stem, b1, pw1, dw1, pw2, pw3, dw2, pw4, scale):
        y = relu6(b, b.op("ember.add", conv(b, x, stem, stride=2, pad=1),
                          b.op("ember.reshape", b1, shape=[c, 1, 1])))
        z = relu6(b, conv(b, y, pw1))
        z = b.op("ember.unslice", z, start=[0, 0, 0, 0], step=[1] * 4,
                 shape=[n, e, h // 2 + 1, h // 2 + 1])
        z = relu6(b, conv(b, z, dw1, stride=2, groups=e))
        y2 = conv(b, z, pw2)
        u = relu6(b, conv(b, y2, pw3))
        u = b.op("ember.unslice", u, start=[0, 0, 1, 1], step=[1] * 4,
                 shape=[n, e, h // 4 + 2, h // 4 + 2])
        u = b.op("ember.mul", conv(b, u, dw2, groups=e), scale)
        return [b.op("ember.add", conv(b, u, pw4), y2)]

    shapes = [(n, 3, h, h), (c, 3, 3, 3), (c,), (e, c, 1, 1), (e, 1, 3, 3), (c, e, 1, 1),
              (e, c, 1, 1), (e, 1, 3, 3), (c, e, 1, 1), (n, e, 1, 1)]
    return graph(shapes, fn), shapes
