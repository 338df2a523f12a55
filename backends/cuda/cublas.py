"""GEMMs on bf16/f16 operands with f32 sums: one `cublasGemmStridedBatchedEx` call each,
planned here (pure Python) and made by the executable through cupy's thin cuBLAS wrapper.

cupy's matmul has no bf16 and no f32 result of f16 operands, so a low-precision Gemm step
carries its cuBLAS call instead: cuBLAS is column-major, so row-major C = A @ B is asked
for as C^T = B^T A^T, each operand read in place where its view has a unit stride along
either matrix axis (a transposed operand is the other `op`), and its batch dims collapse
to one batch stride. The emulator runs the same call with numpy on cuBLAS's terms
(emulate.py), so the plan is checked without a GPU.
"""

from __future__ import annotations

import math

from .program import GemmEx, Matrix, View

# cudaDataType_t (library_types.h) and cublasComputeType_t (cublas_api.h)
DATA_TYPE = {"f32": 0, "f16": 2, "bf16": 14}
COMPUTE_32F = 68
GEMM_DEFAULT = -1
OP_N, OP_T = 0, 1


def low_precision(dtypes: tuple[str, ...]) -> bool:
    """Whether a GEMM of these (a, b, out) dtypes is one for cuBLAS's Ex call: bf16 or f16
    operands, f32 sums (`ember.matmul {dtype = "f32"}`)."""
    a, b, out = dtypes
    return a == b and a in ("bf16", "f16") and out == "f32"


def plan(out: View, a: View, b: View, dtypes: tuple[str, ...]) -> GemmEx | None:
    """The call computing `out = a @ b` (row-major views, numpy's batch broadcasting), or
    None where an operand's view is not one cuBLAS reads (a contiguous copy of it
    `expanded` to `out`'s batch always is)."""
    batch = out.shape[:-2]
    (M, N), K = out.shape[-2:], a.shape[-1]
    views = [expanded(v, batch) for v in (b, a, out)]  # cuBLAS's A, B, C
    dims = _collapse(batch, [v.strides[:-2] for v in views])
    if dims is None:
        return None
    count, strides = dims
    shapes = [(N, K), (K, M), (N, M)]  # the transposed operands cuBLAS multiplies
    mats = []
    for v, (rows, cols), stride, dtype in zip(views, shapes, strides, (dtypes[1], dtypes[0],
                                                                        dtypes[2])):
        m = _matrix(v.slot, dtype, v.strides[-1], v.strides[-2], rows, cols, stride)
        if m is None:
            return None
        mats.append(m)
    if mats[2].op != OP_N:
        return None
    return GemmEx(N, M, K, count, *mats)


def expanded(v: View, batch: tuple[int, ...]) -> View:
    """`v` with `batch` dims in front, stride 0 where it has none (or size 1)."""
    extra = len(batch) - (len(v.shape) - 2)
    strides = (0,) * extra + tuple(0 if d == 1 else s
                                   for d, s in zip(v.shape[:-2], v.strides[:-2]))
    return View(v.slot, (*batch, *v.shape[-2:]), (*strides, *v.strides[-2:]))


def _collapse(batch: tuple[int, ...], strides: list[tuple[int, ...]]
              ) -> tuple[int, list[int]] | None:
    """The batch as one count and one stride per operand, or None where some operand's
    batch dims do not follow each other in memory."""
    dims = [(d, [s[i] for s in strides]) for i, d in enumerate(batch) if d != 1]
    if not dims:
        return 1, [0] * len(strides)
    for (_, s0), (d1, s1) in zip(dims, dims[1:]):
        if any(x != d1 * y for x, y in zip(s0, s1)):
            return None
    return math.prod(batch), dims[-1][1]


def _matrix(slot: int, dtype: str, unit: int, step: int, rows: int, cols: int,
            stride: int) -> Matrix | None:
    """The cuBLAS operand (rows x cols, column-major) that is the transpose of a row-major
    view X (cols x rows, element (i, j) at i * `step` + j * `unit`): X's memory as it is
    (OP_N, leading dimension `step`) where `unit` is 1, or read transposed (OP_T, leading
    dimension `unit`) where `step` is 1; None where neither is."""
    if unit == 1 or rows == 1:  # X is cols x rows, row-major: column-major rows x cols
        ld = step if cols > 1 else rows
        return Matrix(slot, dtype, OP_N, max(ld, 1), stride) if ld >= rows else None
    if step == 1 or cols == 1:
        ld = unit if rows > 1 else cols
        return Matrix(slot, dtype, OP_T, max(ld, 1), stride) if ld >= cols else None
    return None
