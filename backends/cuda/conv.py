"""Bodies of the window kernels: im2col and col2im (conv2d and its gradients go through
cuBLAS between them) and the pooling kernels. Each is a map kernel over its output, whose
body decodes the flat index into NCHW coordinates and walks a window of an `ex0` buffer.

Geometry (as the interpreter's): output o of a window covers input o * stride - pad +
tap * dilation; taps outside the input read zero (conv, avg pool: count_include_pad) or
-inf (max pool: padding never wins). col2im and the pool gradients gather (each input
element sums the windows that cover it), so no atomics and no nondeterminism.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.dialects.kernel import conv_output
from .scalar import ctype, literal


@dataclass(frozen=True)
class Window:
    """A 2-D window geometry over NCHW tensors: input h x w, output oh x ow."""

    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int = 1
    dw: int = 1

    @property
    def oh(self) -> int:
        return (self.h + 2 * self.ph - self.dh * (self.kh - 1) - 1) // self.sh + 1

    @property
    def ow(self) -> int:
        return (self.w + 2 * self.pw - self.dw * (self.kw - 1) - 1) // self.sw + 1

    @classmethod
    def conv(cls, x_shape, w_shape, attrs) -> Window:
        return cls(x_shape[2], x_shape[3], w_shape[2], w_shape[3], *attrs["stride"],
                   *attrs["padding"], *attrs["dilation"])

    @classmethod
    def pool(cls, x_shape, attrs) -> Window:
        return cls(x_shape[2], x_shape[3], *attrs["kernel"], *attrs["stride"], *attrs["padding"])


def _unravel(index: str, names_sizes: list[tuple[str, int]], itype: str) -> list[str]:
    """`const itype name = ...;` for each coordinate of `index` over the sizes (outer first)."""
    lines, rest = [f"{itype} r_ = {index};"], names_sizes[::-1]
    for k, (n, size) in enumerate(rest):
        if k == len(rest) - 1:
            lines.append(f"const {itype} {n} = r_;")
        else:
            lines += [f"const {itype} {n} = r_ % {size};", f"r_ /= {size};"]
    return lines


def im2col_body(n: int, c: int, g: int, win: Window, layout: str, itype: str, dtype: str):
    """cols from x [n, c, h, w] (`ex0`). layout "ngkp": cols [n, g, c/g * kh * kw, oh * ow]
    (conv2d's GEMM operand); "gknp": cols [g, c/g * kh * kw, n, oh * ow] (conv2d_grad_weight's,
    so one GEMM contracts over n and the output positions together)."""
    cg, p = c // g, win.oh * win.ow
    kk = cg * win.kh * win.kw
    order = ([("n", n), ("gi", g), ("k", kk), ("pos", p)] if layout == "ngkp"
             else [("gi", g), ("k", kk), ("n", n), ("pos", p)])

    def body(vals, i):
        lines = _unravel(i, order, itype)
        lines += [
            f"const {itype} ci = k / {win.kh * win.kw}, tap = k % {win.kh * win.kw};",
            f"const {itype} y = (pos / {win.ow}) * {win.sh} - {win.ph} + "
            f"(tap / {win.kw}) * {win.dh};",
            f"const {itype} x = (pos % {win.ow}) * {win.sw} - {win.pw} + "
            f"(tap % {win.kw}) * {win.dw};",
            f"const {ctype(dtype)} v = (y >= 0 && y < {win.h} && x >= 0 && x < {win.w}) ? "
            f"ex0[((n * {c} + gi * {cg} + ci) * {win.h} + y) * {win.w} + x] : "
            f"{literal(dtype, 0)};",
        ]
        return lines, ["v"]

    return body


def _covering(coord: str, size_out: int, k: int, s: int, p: int, d: int, tap: str, o: str,
              itype: str) -> list[str]:
    """Statements that set `o` to the output position whose tap `tap` lands on input
    coordinate `coord`, or continue when there is none."""
    return [f"const {itype} t_{o} = {coord} + {p} - {tap} * {d};",
            f"if (t_{o} < 0 || t_{o} % {s} != 0) continue;",
            f"const {itype} {o} = t_{o} / {s};",
            f"if ({o} >= {size_out}) continue;"]


def col2im_body(c: int, g: int, win: Window, itype: str, dtype: str, acc: str):
    """dx [n, c, h, w] from dcols [n, g, c/g * kh * kw, oh * ow] (`ex0`): each input element
    sums the window taps that read it."""
    cg, p = c // g, win.oh * win.ow
    kk = cg * win.kh * win.kw

    def body(vals, i):
        lines = _unravel(i, [("n", 0), ("ch", c), ("y", win.h), ("x", win.w)], itype)
        lines += [f"const {itype} gi = ch / {cg}, ci = ch % {cg};",
                  f"{acc} s = 0;",
                  f"for (int i_ = 0; i_ < {win.kh}; ++i_) {{",
                  *["  " + s for s in _covering("y", win.oh, win.kh, win.sh, win.ph, win.dh,
                                                "i_", "oy", itype)],
                  f"  for (int j_ = 0; j_ < {win.kw}; ++j_) {{",
                  *["    " + s for s in _covering("x", win.ow, win.kw, win.sw, win.pw, win.dw,
                                                  "j_", "ox", itype)],
                  f"    s += ex0[((n * {g} + gi) * {kk} + (ci * {win.kh} + i_) * {win.kw} + j_)"
                  f" * {p} + oy * {win.ow} + ox];",
                  "  }",
                  "}"]
        return lines, [f"({ctype(dtype)})s"]

    return body


def _window_loop(win: Window, c: int, itype: str, inner: list[str]) -> list[str]:
    """Loops over the taps of output (n, ch, oy, ox): `inside`, `v`-address `at` in scope."""
    return [f"for (int i_ = 0; i_ < {win.kh}; ++i_) {{",
            f"  const {itype} y = oy * {win.sh} - {win.ph} + i_;",
            f"  for (int j_ = 0; j_ < {win.kw}; ++j_) {{",
            f"    const {itype} x = ox * {win.sw} - {win.pw} + j_;",
            f"    const bool inside = y >= 0 && y < {win.h} && x >= 0 && x < {win.w};",
            f"    const {itype} at = ((n * {c} + ch) * {win.h} + y) * {win.w} + x;",
            *["    " + s for s in inner],
            "  }",
            "}"]


def _out_coords(i: str, c: int, win: Window, itype: str) -> list[str]:
    return _unravel(i, [("n", 0), ("ch", c), ("oy", win.oh), ("ox", win.ow)], itype)


def max_pool_body(c: int, win: Window, itype: str, dtype: str):
    """The max of each window; padding is -inf, NaN wins (np.max)."""
    t, ninf = ctype(dtype), literal(dtype, float("-inf"))

    def body(vals, i):
        lines = _out_coords(i, c, win, itype) + [f"{t} m = {ninf};"]
        lines += _window_loop(win, c, itype, [
            f"const {t} v = inside ? ex0[at] : {ninf};",
            "m = ember_fmax(m, v);"])
        return lines, ["m"]

    return body


def conv_nhwc_body(op, itype: str):
    """y[n, oy, ox, o] of a channels-last conv (`ember.conv2d_nhwc`, or a
    `kernel.conv2d_nhwc`'s conv: x [n, h, w, c] `ex0`,
    weight [kh, kw, c/groups, o] `ex1`): its window's sum over the taps and the group's
    input channels, padded by `top` and `left` (the bottom and right by what oh, ow leave)."""
    (_, h, w, c), (kh, kw, cg, o) = (v.type.shape for v in op.operands[:2])
    a = op.attributes
    oh, ow = conv_output(op)[1:3]
    dtype = op.operands[0].type.dtype
    (sh, sw), (dh, dw), (top, left) = a["stride"], a["dilation"], a["padding"][:2]
    og = o // (c // cg)
    acc = "double" if dtype == "f64" else "float"

    def body(vals, i):
        lines = _unravel(i, [("n", 0), ("oy", oh), ("ox", ow), ("o", o)], itype)
        lines += [
            f"const {itype} c0 = (o / {og}) * {cg};",
            f"{acc} s = 0;",
            f"for (int ki = 0; ki < {kh}; ++ki) {{",
            f"  const {itype} y = oy * {sh} - {top} + ki * {dh};",
            f"  if (y < 0 || y >= {h}) continue;",
            f"  for (int kj = 0; kj < {kw}; ++kj) {{",
            f"    const {itype} x = ox * {sw} - {left} + kj * {dw};",
            f"    if (x < 0 || x >= {w}) continue;",
            f"    for (int ci = 0; ci < {cg}; ++ci)",
            f"      s += ({acc})ex0[((n * {h} + y) * {w} + x) * {c} + c0 + ci] * "
            f"({acc})ex1[((ki * {kw} + kj) * {cg} + ci) * {o} + o];",
            "  }",
            "}",
        ]
        return lines, [f"({ctype(dtype)})s"]

    return body


def avg_pool_body(c: int, win: Window, itype: str, dtype: str):
    """The mean of each window, zero padding counted (count_include_pad)."""
    t = ctype(dtype)

    def body(vals, i):
        lines = _out_coords(i, c, win, itype) + [f"{t} s = 0;"]
        lines += _window_loop(win, c, itype, ["if (inside) s += ex0[at];"])
        return lines, [f"(s / ({t}){win.kh * win.kw})"]

    return body


def _sum_over_covering_windows(i: str, c: int, win: Window, itype: str, t: str,
                               inner: list[str]) -> list[str]:
    """Lines that unravel input element `i` into (n, ch, y0, x0) and add to `s` what
    `inner` adds for each output window (oy, ox) covering it (tap ki, kj)."""
    lines = _unravel(i, [("n", 0), ("ch", c), ("y0", win.h), ("x0", win.w)], itype)
    return lines + [f"{t} s = 0;",
                    f"for (int ki = 0; ki < {win.kh}; ++ki) {{",
                    *["  " + s for s in _covering("y0", win.oh, win.kh, win.sh, win.ph, 1,
                                                  "ki", "oy", itype)],
                    f"  for (int kj = 0; kj < {win.kw}; ++kj) {{",
                    *["    " + s for s in _covering("x0", win.ow, win.kw, win.sw, win.pw, 1,
                                                    "kj", "ox", itype)],
                    *["    " + s for s in inner],
                    "  }",
                    "}"]


def max_pool_grad_body(c: int, win: Window, itype: str, dtype: str):
    """dx[n, c, y, x] = sum of g over the windows whose FIRST maximum (row-major, padding
    -inf, the first NaN wins as np.argmax) is this element; x is `ex0`, g is `ex1`."""
    t, ninf = ctype(dtype), literal(dtype, float("-inf"))
    inner = [f"{t} best = {ninf}; int first = 0, tap = 0;",
             *_window_loop(win, c, itype, [
                 f"const {t} v = inside ? ex0[at] : {ninf};",
                 "if (tap == 0 || v > best || (v != v && best == best)) "
                 "{ best = v; first = tap; }",
                 "++tap;"]),
             f"if (first == ki * {win.kw} + kj) "
             f"s += ex1[((n * {c} + ch) * {win.oh} + oy) * {win.ow} + ox];"]

    def body(vals, i):
        return _sum_over_covering_windows(i, c, win, itype, t, inner), ["s"]

    return body


def avg_pool_grad_body(c: int, win: Window, itype: str, dtype: str):
    """dx[n, c, y, x] = sum over the windows covering it of g / (kh * kw); g is `ex0`."""
    t = ctype(dtype)
    inner = [f"s += ex0[((n * {c} + ch) * {win.oh} + oy) * {win.ow} + ox];"]

    def body(vals, i):
        return (_sum_over_covering_windows(i, c, win, itype, t, inner),
                [f"(s / ({t}){win.kh * win.kw})"])

    return body
