"""numpy's bundled OpenBLAS, called straight from generated code.

numpy's wheels ship scipy-openblas (64-bit integers, symbols suffixed `64_`); its
`scipy_cblas_sgemm64_` is found with ctypes in numpy's `.libs` folder (or any
`libscipy_openblas*` / system OpenBLAS), and `llvm.add_symbol` makes it resolvable by
MCJIT, so a GEMM inside the compiled step is one direct call: no Python, no copies, and
transposed operands are passed as BLAS transposes.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
from dataclasses import dataclass

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from ....settings import BLAS
from ..kernels.scalar import I32, I64, PTR

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


@dataclass(frozen=True)
class Blas:
    path: str
    sgemm: str
    dgemm: str
    ilp64: bool  # 64-bit integer arguments
    sgemm_addr: int
    dgemm_addr: int
    set_threads: object | None


def _candidates() -> list[str]:
    root = os.path.dirname(os.path.dirname(np.__file__))
    out = sorted(glob.glob(os.path.join(root, "numpy.libs", "libscipy_openblas*.so*")))
    out += sorted(glob.glob(os.path.join(root, "scipy_openblas*", "lib", "*.so*")))
    out += sorted(glob.glob(os.path.join(os.path.dirname(np.__file__), ".dylibs",
                                         "libscipy_openblas*.dylib")))
    return out


@functools.cache
def find() -> Blas | None:
    """The BLAS ember calls, or None (then every GEMM is ember's own).
    `EMBER_BLAS=0` disables it."""
    if not BLAS.get():
        return None
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix, ilp in (("scipy_cblas_", "64_", True), ("scipy_cblas_", "", False),
                                    ("cblas_", "", False)):
            s, d = f"{prefix}sgemm{suffix}", f"{prefix}dgemm{suffix}"
            if hasattr(lib, s) and hasattr(lib, d):
                setter = getattr(lib, f"scipy_openblas_set_num_threads{suffix}", None)
                return Blas(path, s, d, ilp, ctypes.cast(getattr(lib, s), ctypes.c_void_p).value,
                            ctypes.cast(getattr(lib, d), ctypes.c_void_p).value, setter)
    return None


@functools.cache
def load_symbols() -> None:
    blas = find()
    if blas is not None:
        llvm.add_symbol(blas.sgemm, blas.sgemm_addr)
        llvm.add_symbol(blas.dgemm, blas.dgemm_addr)


def call_gemm(b: ir.IRBuilder, dtype: str, trans_a: bool, trans_b: bool, m: int, n: int,
              k: int, a, lda: int, bp, ldb: int, c, ldc: int, beta: float = 0.0) -> None:
    """C = A B + beta C (row-major) via `?gemm`."""
    blas = find()
    it = I64 if blas.ilp64 else I32
    el = ir.FloatType() if dtype == "f32" else ir.DoubleType()
    name = blas.sgemm if dtype == "f32" else blas.dgemm
    fn = b.module.globals.get(name) or ir.Function(
        b.module, ir.FunctionType(ir.VoidType(), [I32, I32, I32, it, it, it, el, PTR, it, PTR,
                                                  it, el, PTR, it]), name)

    def n_(v):
        return ir.Constant(it, v)

    b.call(fn, [ir.Constant(I32, ROW_MAJOR), ir.Constant(I32, TRANS if trans_a else NO_TRANS),
                ir.Constant(I32, TRANS if trans_b else NO_TRANS), n_(m), n_(n), n_(k),
                ir.Constant(el, 1.0), a, n_(lda), bp, n_(ldb), ir.Constant(el, beta), c,
                n_(ldc)])


def layout(rows: int, cols: int, s_row: int, s_col: int) -> tuple[bool, int] | None:
    """(transposed, leading dimension) for a rows x cols operand with these strides, as
    BLAS takes it row-major; None when neither dim has unit stride."""
    if s_col == 1 or cols == 1:
        ld = s_row if rows > 1 else max(cols, 1)
        if ld >= max(cols, 1):
            return False, ld
    if s_row == 1 or rows == 1:
        ld = s_col if cols > 1 else max(rows, 1)
        if ld >= max(rows, 1):
            return True, ld
    return None
