"""Host-side launch arithmetic: grid and block sizes, shared-memory bytes, vector widths.

Pure Python (no cupy), so every choice is unit-tested without a GPU. Kernels use
grid-stride loops, so a grid never needs to cover all the work: it is capped at a few
waves of resident blocks (`sm_count` streaming multiprocessors, 2048 threads each).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..strides import cdiv

BLOCK = 256            # threads per block of elementwise kernels
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535
DEFAULT_SMS = 132      # an H100/H200; the executable asks the device for its own count
THREADS_PER_SM = 2048
WAVES = 2              # grid cap: resident blocks times this
VECTOR_BYTES = 16      # float4 loads and stores
ALIGN = 256            # byte alignment of every buffer the backend allocates or accepts
TILE = 32              # transpose tile edge; a tile row is padded by one element
TILE_ROWS = 8          # a transpose block is TILE x TILE_ROWS threads
ROW_BLOCK_MAX = 512    # most threads one row reduction uses
SPLIT_MIN = 4096       # reduced elements per block before a reduction is split across blocks
INT32_LIMIT = 2**31 - 1 - 2**26  # an int index plus a grid stride must not overflow


@dataclass(frozen=True)
class LaunchConfig:
    """What `RawKernel.__call__(grid, block, args, shared_mem=...)` needs."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int = 0  # dynamic shared-memory bytes

    @property
    def threads(self) -> int:
        return math.prod(self.grid) * math.prod(self.block)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def max_blocks(sm_count: int, block: int) -> int:
    return max(1, sm_count * (THREADS_PER_SM // block) * WAVES)


def elementwise(work: int, sm_count: int = DEFAULT_SMS, block: int = BLOCK) -> LaunchConfig:
    """A 1-D grid-stride launch over `work` items (elements, or vectors of elements)."""
    grid = max(1, min(cdiv(work, block), max_blocks(sm_count, block), MAX_GRID_X))
    return LaunchConfig((grid, 1, 1), (block, 1, 1))


def index_type(*sizes: int) -> str:
    """`int` indices when every size fits in 31 bits with room for a grid-stride step
    (faster), else `long long`."""
    return "int" if max(sizes, default=0) <= INT32_LIMIT else "long long"


def vector_width(n: int, dtypes: list[str], layouts: list[str]) -> int:
    """4 (float4 loads and stores) when every operand and result is f32 and every input is
    either the full contiguous tensor or a broadcast scalar; else 1 (scalar code).

    Alignment: the backend allocates every buffer 256-byte aligned and re-aligns inputs
    that are not (`aligned`), and a vector index i reads bytes [16 i, 16 i + 16), so a
    float4 access is always 16-byte aligned. A tail of n % 4 elements runs scalar.
    """
    width = VECTOR_BYTES // 4
    ok = n >= width and all(d == "f32" for d in dtypes) and \
        all(lay in ("full", "scalar") for lay in layouts)
    return width if ok else 1


def aligned(address: int, align: int = VECTOR_BYTES) -> bool:
    return address % align == 0


def round_up(n: int, align: int = ALIGN) -> int:
    return cdiv(n, align) * align


@dataclass(frozen=True)
class ReducePlan:
    """How one reduction runs.

    strategy "row": the innermost input axis is reduced; one block per output element
    (warp shuffles, then the warps' partials through shared memory), threads stride along
    the row so loads are coalesced. "column": the innermost axis is kept; one thread per
    output element, so neighbouring threads read neighbouring addresses. With `splits` > 1
    each output is reduced in `splits` chunks (block y, or a second thread index) into a
    partial buffer [splits, outputs], which a finalize kernel reduces.
    """

    strategy: str
    launch: LaunchConfig
    splits: int = 1
    chunk: int = 0                       # reduced elements per split
    finalize: LaunchConfig | None = None
    outputs: int = 1

    @property
    def partial_elems(self) -> int:
        """Elements of the [splits, outputs] partial buffer (0 when not split)."""
        return 0 if self.splits == 1 else self.splits * self.outputs


def reduce_plan(outputs: int, reduced: int, inner_reduced: bool, acc_bytes: int,
                sm_count: int = DEFAULT_SMS, allow_split: bool = True) -> ReducePlan:
    """Choose the strategy, block size, shared memory and split factor of a reduction of
    `outputs` results over `reduced` elements each (fused reductions never split)."""
    outputs, reduced = max(outputs, 1), max(reduced, 1)
    resident = sm_count * THREADS_PER_SM
    if inner_reduced:
        block = min(ROW_BLOCK_MAX, max(32, next_pow2(reduced)))
        splits = 1
        if allow_split and outputs < 2 * sm_count and reduced > SPLIT_MIN:
            splits = min(cdiv(reduced, SPLIT_MIN), cdiv(4 * sm_count, outputs), MAX_GRID_YZ)
        chunk = cdiv(reduced, splits)
        splits = cdiv(reduced, chunk)  # no empty split
        grid = (min(outputs, MAX_GRID_X), splits, 1)
        launch = LaunchConfig(grid, (block, 1, 1), (block // 32) * acc_bytes)
    else:
        splits = 1
        if allow_split and outputs * 4 < resident and reduced >= 256:
            splits = max(1, min(resident // (4 * outputs), cdiv(reduced, 64), MAX_GRID_YZ))
        chunk = cdiv(reduced, splits)
        splits = cdiv(reduced, chunk)
        launch = elementwise(outputs * splits, sm_count)
    fin = elementwise(outputs, sm_count) if splits > 1 else None
    return ReducePlan("row" if inner_reduced else "column", launch, splits, chunk, fin,
                      outputs)


def transpose(na: int, nb: int, batch: int, itemsize: int) -> LaunchConfig:
    """A tiled transpose: tiles of TILE x TILE over (a: the input's contiguous axis, b: the
    output's), a (TILE + 1)-padded tile in shared memory so column reads hit distinct
    banks; grid y and z stride over what exceeds 65535."""
    grid = (min(cdiv(na, TILE), MAX_GRID_X), min(cdiv(nb, TILE), MAX_GRID_YZ),
            min(max(batch, 1), MAX_GRID_YZ))
    return LaunchConfig(grid, (TILE, TILE_ROWS, 1), TILE * (TILE + 1) * itemsize)
