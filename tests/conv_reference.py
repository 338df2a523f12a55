"""The convolution as nested loops over output pixels, in float64: the independent reference
that the interpreter's conv2d and the Conv layers are both checked against."""

import numpy as np


def conv2d_loops(x, w, stride, padding, dilation, groups, bias=None):
    n, c, h, wd = x.shape
    co, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, co, oh, ow))
    for o in range(co):
        g = o // (co // groups)
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, g * cg:(g + 1) * cg, i * sh:i * sh + dh * (kh - 1) + 1:dh,
                           j * sw:j * sw + dw * (kw - 1) + 1:dw]
                y[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3))
    return y if bias is None else y + bias[:, None, None]
