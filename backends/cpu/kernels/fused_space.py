"""The iteration space of a fused kernel (fused.py), normalized: size-1 dims dropped,
neighbours that every map walks as one merged, and reductions reordered where another
order vectorizes or splits better (`kernel_shape`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ACC_STACK_LIMIT = 1 << 18  # bytes of column accumulators kept on the stack (more: scratch)
ACC_BYTES = 8  # one accumulator's slot, whatever the dtype


@dataclass
class Shape:
    """A kernel's iteration space and maps after normalization."""

    space: list[int]
    ins: list[list[int]]
    outs: list[list[int]]
    index: dict[int, int | None]  # original dim -> normalized dim (None: size 1)
    reduce: frozenset[int]


def normalize(space: Sequence[int], ins, outs, reduce_dims: set[int],
              index_dims: set[int]) -> Shape:
    keep = [d for d, n in enumerate(space) if n != 1]
    groups: list[list[int]] = []
    maps = list(ins) + list(outs)
    for d in keep:
        if groups:
            p = groups[-1][-1]
            same_class = (p in reduce_dims) == (d in reduce_dims)
            if (same_class and p not in index_dims and d not in index_dims
                    and all(m[p] == m[d] * space[d] for m in maps)):
                groups[-1].append(d)
                continue
        groups.append([d])
    new_space = [1] * len(groups)
    where: dict[int, int | None] = {d: None for d in range(len(space))}
    for k, g in enumerate(groups):
        for d in g:
            new_space[k] *= space[d]
            where[d] = k

    def remap(m):
        return [m[g[-1]] for g in groups]

    red = frozenset(where[d] for d in reduce_dims if where[d] is not None)
    return Shape(new_space, [remap(m) for m in ins], [remap(m) for m in outs], where, red)


# a row kernel (reducing along its last dim) whose rows are shorter than this, and at
# least as many as this, reduces across rows instead: its vector lanes are rows
SHORT_ROW = 16


def _rows_across_lanes(shape: Shape, reductions: int) -> Shape:
    """[rows, n] reduced along n, n shorter than a vector: the same kernel over [n, rows]
    (the reduced dim outermost), so that it runs as a column kernel whose accumulators
    and arithmetic vectorize across rows (a classifier's cross-entropy over 10 classes
    would otherwise compute element by element), where its accumulators (one per row and
    reduction) fit the stack; it then runs on one thread. Other shapes as they are."""
    sp = shape.space
    if not (len(sp) == 2 and shape.reduce == frozenset({1}) and sp[1] < SHORT_ROW <= sp[0]
            and sp[0] * reductions * ACC_BYTES <= ACC_STACK_LIMIT):
        return shape
    return _swap_last_two(shape)


def _columns_read_down(shape: Shape, reductions: int) -> Shape:
    """[..., rows, n] reduced along n where every input varying along n is laid out the
    other way round (unit stride along the rows, a larger one along n: a channels-last
    global pool, [c, h*w] over each image's [h*w, c]): the same kernel over [..., n, rows],
    a column kernel vectorized across the rows; row by row it loaded one element at a
    time (a squeeze-excite's pool of 56 x 56 x 16: 22 us, 6 as columns). Where the rows
    fill a vector and their accumulators fit the stack."""
    sp = shape.space
    last = len(sp) - 1
    if last < 1 or shape.reduce != frozenset({last}):
        return shape
    along = [m for m in shape.ins if m[last]]
    if not (sp[last - 1] >= SHORT_ROW and along
            and all(m[last - 1] == 1 and m[last] > 1 for m in along)
            and sp[last - 1] * reductions * ACC_BYTES <= ACC_STACK_LIMIT):
        return shape
    return _swap_last_two(shape)


def _swap_last_two(shape: Shape) -> Shape:
    """`shape` with its last two dims swapped, the reduced one (the last) now first."""
    k = len(shape.space)
    return _reordered(shape, [*range(k - 2), k - 1, k - 2])


def _reordered(shape: Shape, order: list[int]) -> Shape:
    """`shape` with its dims in `order` (dim j of the result is dim order[j])."""
    where = {d: j for j, d in enumerate(order)}

    def dims(m):
        return [m[d] for d in order]
    return Shape(dims(shape.space), [dims(m) for m in shape.ins], [dims(m) for m in shape.outs],
                 {d: None if k is None else where[k] for d, k in shape.index.items()},
                 frozenset(where[d] for d in shape.reduce))


# the shortest innermost dim `_reduced_dims_innermost` moves parallel dims out for
SLAB_ROW = 64


def _reduced_dims_innermost(shape: Shape) -> Shape:
    """A kernel that reduces along its innermost dim and others outside a parallel one
    (BatchNorm's statistics over [n, c, h*w] reduce n and h*w per channel c): the same
    kernel with its parallel dims outermost ([c, n, h*w]), so that it runs as a row
    kernel, split across threads by channel, each channel's passes (its statistics, then
    what it stores) over a slab that stays in cache. As a column kernel it had no
    parallel dim to split (its first dim is reduced) and every pass went through
    memory: ResNet-18's BatchNorms ran on one thread at ~11 GB/s (2.3x faster so at
    32x32). The innermost dim stays innermost (so loads stay contiguous) and at least
    `SLAB_ROW` long: at 4x4 a channel's rows are 64 bytes 32 KB apart, which the row
    kernel read from memory slower than the column kernel streams them."""
    sp, red = shape.space, shape.reduce
    if not red or len(sp) - 1 not in red or sp[-1] < SLAB_ROW:
        return shape
    order = [d for d in range(len(sp)) if d not in red] + sorted(red)
    return shape if order == list(range(len(sp))) else _reordered(shape, order)


def kernel_shape(space: Sequence[int], ins, outs, reduce_dims: set[int], index_dims: set[int],
                 reductions: int) -> Shape:
    """The normalized space and maps a kernel's loops run over (`reductions`: its
    kernel.reduce ops, each with accumulators of its own)."""
    shape = normalize(space, ins, outs, reduce_dims, index_dims)
    shape = _columns_read_down(_rows_across_lanes(shape, reductions), reductions)
    return _reduced_dims_innermost(shape)


# operations an element read across its input's layout (a transpose's) counts as: strided
# loads touch a line per element. The NCHW -> NHWC copy of a 224 x 224 image (150K
# elements) took 45 us on one thread, 25 on two, and the conv that read it 82 us after
# the one-thread copy (its rows in one core's cache), 44 after the two-thread one
GATHER_WORK = 4


def out_of_order(strides: list[int]) -> bool:
    """Whether a map reads its input against the input's layout (a stride grows inward)."""
    used = [s for s in strides if s]
    return any(a < b for a, b in zip(used, used[1:]))
