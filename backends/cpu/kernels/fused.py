"""`kernel.fused` (and a matmul's epilogue) to loops.

The space is first normalized (fused_space.py): size-1 dims dropped, neighbours merged
where every map walks them as one (so an elementwise kernel over contiguous buffers is
one flat, vectorized loop), some reductions reordered. Dims split into the reduced set R,
the outer parallel dims before the first reduced dim (P), and the parallel dims after it
(Q). For each point of P:
- each reduction level runs one loop nest over R and Q (in space order) accumulating in
  registers (`reassoc`, so the loop vectorizes) when Q is empty (row kernels: softmax,
  layer norm) or in an array indexed by Q otherwise (column sums: the contiguous dim
  stays innermost and the accumulation vectorizes across it);
- a last nest over R and Q stores what varies along R, one over Q what varies only
  along Q, and the rest is stored once.
Every value is computed in the loop of the innermost dim it varies along, so what a
row shares is computed once per row. The outermost P loop is split across threads when
the kernel is large; a column kernel without P (a bias gradient) splits its reduced rows
instead, each thread into accumulators of its own (`split_rows`), or where it stores more
than its sums, its columns (`_splits_columns`).
"""

from __future__ import annotations

from llvmlite import ir

from ....ir import Value
from ...errors import KernelCompileError
from ..parallel.outline import chunk_index, elem, parallel_chunks, parallel_region, stack_array
from . import scalar as S
from .dropout import dropout
from .fused_space import ACC_BYTES, ACC_STACK_LIMIT, GATHER_WORK, kernel_shape, out_of_order
from .loops import for_range, loop
from .scalar import PTR, i64

# the longest innermost reduced dim of a row kernel that accumulates in a slot per position
SHORT_INNER = 256


class FusedEmitter:
    """Emits one kernel body over its (normalized) space.

    `args`: block arguments, each read from an input pointer through a map; the body's
    ops are evaluated lazily with a scope stack of memoized values.
    """

    def __init__(self, block, space, in_maps, out_maps, in_dtypes, out_dtypes, name: str):
        self.block, self.name = block, name
        self.body = [op for op in block.ops if op.name != "kernel.yield"]
        self.yields = block.ops[-1].operands
        self.in_dtypes, self.out_dtypes = in_dtypes, out_dtypes
        reds = [op for op in self.body if op.name == "kernel.reduce"]
        dims = {tuple(sorted(op.attributes["dims"])) for op in reds}
        if len(dims) > 1:
            raise KernelCompileError(f"{name}: reduces over different dims {sorted(dims)}")
        rdims = set(dims.pop()) if dims else set()
        idims = {op.attributes["dim"] for op in self.body if op.name == "kernel.index"}
        self.shape = kernel_shape(space, in_maps, out_maps, rdims, idims, len(reds))
        sp = self.shape.space
        self.R = self.shape.reduce
        first_r = min(self.R) if self.R else len(sp)
        self.P = [d for d in range(first_r)]
        self.Q = [d for d in range(first_r, len(sp)) if d not in self.R]
        self.column = bool(self.R) and bool(self.Q)
        self.reductions = {op: j for j, op in enumerate(reds)}  # each one's accumulators
        self.scratch: ir.Value | None = None  # where they are when the stack is too small
        # (Q dim, lo, hi): a thread's share of the columns (`_emit_split_columns`)
        self.split_q: tuple | None = None
        self.var = self._varying()
        self.level = self._reduce_levels(reds)
        # the results by the dims their stores vary along: the reduced ones, else Q, else P
        var_store = [self.var[y] | frozenset(d for d, s in enumerate(self.shape.outs[k]) if s)
                     for k, y in enumerate(self.yields)]
        n = len(self.yields)
        self.stores_r = [k for k in range(n) if var_store[k] & self.R]
        self.stores_q = [k for k in range(n) if k not in self.stores_r and
                         var_store[k] & frozenset(self.Q)]
        self.stores_p = [k for k in range(n) if k not in self.stores_r + self.stores_q]

    # -- analysis ---------------------------------------------------------------------------

    def _varying(self) -> dict[Value, frozenset]:
        """Space dims each value depends on (for scheduling: a column accumulator counts
        as varying along all of Q, where it is read from)."""
        var: dict[Value, frozenset] = {}
        for a, m in zip(self.block.args, self.shape.ins):
            var[a] = frozenset(d for d, s in enumerate(m) if s)
        for op in self.body:
            if op.name == "kernel.index":
                d = self.shape.index[op.attributes["dim"]]
                v = frozenset() if d is None else frozenset({d})
            elif op.name == "kernel.reduce":
                v = var[op.operands[0]] - self.R
                if self.column:
                    v = v | frozenset(self.Q)
            else:
                v = frozenset().union(*(var[x] for x in op.operands))
            var[op.result] = v
        return var

    def _reduce_levels(self, reds) -> dict:
        level: dict = {}
        dep: dict[Value, int] = {a: 0 for a in self.block.args}
        for op in self.body:
            d = max((dep[x] for x in op.operands), default=0)
            if op.name == "kernel.reduce":
                level[op] = d + 1
                d += 1
            for r in op.results:
                dep[r] = d
        return level

    def deps(self, values) -> list[Value]:
        """Values needed to compute `values` (transitively, stopping at reduces, whose
        results come from their own phase): block arguments first, then body order."""
        need, stack = set(), list(values)
        while stack:
            v = stack.pop()
            if v in need:
                continue
            need.add(v)
            op = v.op if v.owner is not self.block else None
            if op is not None and op.name != "kernel.reduce":
                stack.extend(op.operands)
        order = [a for a in self.block.args if a in need]
        for op in self.body:
            if op.result in need and op.name != "kernel.reduce":
                order.append(op.result)
        return order

    # -- emission ---------------------------------------------------------------------------

    def emit(self, b: ir.IRBuilder, ins: list, outs: list, threads: int = 1,
             scratch: ir.Value | None = None) -> None:
        """The whole kernel at b's position (ins/outs: element pointers; `scratch`: the
        `scratch_bytes()` it needs, where any)."""
        sp = self.shape.space
        if any(n == 0 for n in sp):
            return
        self.ins, self.outs = ins, outs
        gathers = sum(out_of_order(m) for m in self.shape.ins)
        work = (max(1, len(self.body)) + GATHER_WORK * gathers) * _prod(sp)
        first = self.P[0] if self.P else None
        t = parallel_chunks(work, sp[first], threads) if first is not None else 1
        split = self.split_rows(threads) if scratch is not None else 1  # (not an epilogue)
        if split > 1:
            self._emit_split_rows(b, ins, outs, split, scratch)
            return
        if self.scratch_bytes():  # accumulators past the stack's share, on one thread
            self.scratch, t = scratch, 1
        elif first is None and self._splits_columns():
            self._emit_split_columns(b, ins, outs, parallel_chunks(work, sp[self.Q[0]],
                                                                   threads))
            return
        if t == 1:
            self.run(b, None)
            return

        def chunk(cb, ptrs, lo, hi):
            self.ins, self.outs = ptrs[:len(ins)], ptrs[len(ins):]
            self.run(cb, (lo, hi))

        parallel_region(b, self.name, list(ins) + list(outs),
                        [False] * len(ins) + [True] * len(outs), sp[first], t, chunk)

    def row_unit(self, rows: int, cols: int) -> int | None:
        """Points of the outermost (normalized) dim per row, when this kernel's space is a
        [rows, cols] matrix whose rows that dim walks in order (a matmul's epilogue:
        1, or cols when the space flattened into one dim); None otherwise, or when it
        reduces."""
        sp = self.shape.space
        if self.R or not sp:
            return None
        if sp[0] == rows and _prod(sp[1:]) == cols:
            return 1
        return cols if len(sp) == 1 and sp[0] == rows * cols else None

    def rows_function(self, module: ir.Module, n_ins: int, n_outs: int,
                      unit: int) -> ir.Function:
        """`f(ins..., outs..., r0, r1)`: the kernel on rows [r0, r1) only (`unit` from
        `row_unit`), outputs `noalias` as in a thread's chunk (`emit`)."""
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR] * (n_ins + n_outs)
                                                 + [ir.IntType(64)] * 2), f"{self.name}.rows")
        fn.linkage = "internal"
        for arg in fn.args[n_ins:n_ins + n_outs]:
            arg.add_attribute("noalias")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.ins, self.outs = fn.args[:n_ins], fn.args[n_ins:n_ins + n_outs]
        lo, hi = fn.args[-2:]
        self.run(b, (lo, hi) if unit == 1 else (b.mul(lo, i64(unit)), b.mul(hi, i64(unit))))
        b.ret_void()
        return fn

    def _acc_bytes(self) -> int:
        qsize = _prod([self.shape.space[d] for d in self.Q])
        return qsize * len(self.reductions) * ACC_BYTES

    def scratch_bytes(self, threads: int = 1) -> int:
        """Bytes of column accumulators too many for a thread's stack (one per column and
        reduction), which the kernel then keeps in its scratch and runs on one thread; or,
        where threads split the reduced rows (`split_rows`), a set of them per thread."""
        t = self.split_rows(threads)
        if t > 1:
            return t * self._acc_bytes()
        acc = self._acc_bytes() if self.column else 0
        return acc if acc > ACC_STACK_LIMIT else 0

    def split_rows(self, threads: int) -> int:
        """Threads that each reduce a share of the rows into column accumulators of their
        own, added after: a column kernel (a bias gradient and its optimizer update: the
        sum over a [2048, 128] gradient's rows ran on one thread, 35-40 us, for each of a
        GPT's 40-odd biases and norms) reducing along its outermost dim in one level,
        storing nothing per row, with few enough accumulators. 1: as the kernel is."""
        if not (self.column and not self.P and min(self.R) == 0
                and len(set(self.level.values())) == 1 and self._acc_bytes() <= ACC_STACK_LIMIT
                and not self.stores_r):
            return 1
        work = max(1, len(self.body)) * _prod(self.shape.space)
        return parallel_chunks(work, self.shape.space[0], threads)

    def _emit_split_rows(self, b: ir.IRBuilder, ins: list, outs: list, t: int,
                         scratch: ir.Value) -> None:
        """`split_rows`: each thread's share of the rows into its accumulators (thread c's
        at scratch + c * _acc_bytes()), the sets added into the first, then what the
        kernel stores, on this thread."""
        n, per = self.shape.space[0], self._acc_bytes()
        reds = sorted(self.level, key=self.level.get)

        def chunk(cb, ptrs, lo, hi):
            self.ins, self.outs = ptrs[:len(ins)], ptrs[len(ins):-1]
            self._start(cb)
            base = cb.gep(ptrs[-1], [cb.mul(chunk_index(cb, lo, n, t), i64(per))],
                          inbounds=True, source_etype=ir.IntType(8))
            self.reduce_phase(reds, (lo, hi), base)

        parallel_region(b, f"{self.name}.rows", list(ins) + list(outs) + [scratch],
                        [False] * len(ins) + [True] * (len(outs) + 1), n, t, chunk)
        self.ins, self.outs = ins, outs
        self._start(b)
        qsize = _prod([self.shape.space[d] for d in self.Q])
        for op in reds:
            ty, kind, dt = S.REG[op.result.type.dtype], op.attributes["kind"], op.result.type.dtype
            acc = [self._accumulators(b, scratch, op, c * per) for c in range(t)]

            def add(i, acc=acc, ty=ty, kind=kind, dt=dt):
                total = b.load(elem(b, acc[0], ty, i), typ=ty)
                for other in acc[1:]:
                    total = S.combine(b, kind, total, b.load(elem(b, other, ty, i), typ=ty), dt)
                b.store(total, elem(b, acc[0], ty, i))
            loop(b, qsize, add, "acc")
            self.acc[op] = acc[0]
        self.run_stores()

    def _splits_columns(self) -> bool:
        """Whether threads can take shares of a column kernel's first Q dim (its columns),
        each reducing and storing its own: one without a parallel dim to split, storing
        nothing outside Q (BatchNorm's statistics and normalization over [n, c, 4x4]
        reduce n and the 4x4 per channel c; fused_space.py's `_reduced_dims_innermost`
        leaves short rows to the column kernel, which ran on one thread)."""
        return self.column and not self.P and not self.stores_p

    def _emit_split_columns(self, b: ir.IRBuilder, ins: list, outs: list, t: int) -> None:
        """`_splits_columns`: the kernel, each thread over its share of the first Q dim's
        points (`split_q`), its accumulators on its own stack."""
        q = self.Q[0]
        if t == 1:
            self.run(b, None)
            return

        def chunk(cb, ptrs, lo, hi):
            self.ins, self.outs = ptrs[:len(ins)], ptrs[len(ins):]
            self.split_q = (q, lo, hi)
            self.run(cb, None)
            self.split_q = None

        parallel_region(b, f"{self.name}.columns", list(ins) + list(outs),
                        [False] * len(ins) + [True] * len(outs), self.shape.space[q], t,
                        chunk)

    def _accumulators(self, b: ir.IRBuilder, base: ir.Value, op, offset: int = 0) -> ir.Value:
        """Where reduction `op`'s column accumulators are in a set of them at `base` +
        `offset` bytes (one set: a slot per column for each reduction in turn)."""
        qsize = _prod([self.shape.space[d] for d in self.Q])
        return b.gep(base, [i64(offset + self.reductions[op] * qsize * ACC_BYTES)],
                     inbounds=True, source_etype=ir.IntType(8))

    def _start(self, b: ir.IRBuilder) -> None:
        """A fresh emission state at b's position."""
        self.b = b
        self.idx: dict[int, ir.Value] = {}
        self.scopes: list[dict] = [{}]
        self.acc: dict = {}

    def run(self, b: ir.IRBuilder, split) -> None:
        self._start(b)
        n = len(self.yields)
        if not self.R:
            self.phase(self.P, lambda: [self.store(k) for k in range(n)], self.yields, split)
        else:
            self.phase(self.P, self.after_p, [], split)

    def after_p(self) -> None:
        reds = sorted(self.level, key=self.level.get)
        for lvl in sorted(set(self.level.values())):
            self.reduce_phase([op for op in reds if self.level[op] == lvl])
        self.run_stores()

    def run_stores(self) -> None:
        """After the reductions: the stores, by the dims they vary along (`stores_r`, ...)."""
        loop_rq = [d for d in range(len(self.shape.space)) if d in self.R or d in self.Q]
        if self.stores_r:
            self.phase(loop_rq, lambda: [self.store(k) for k in self.stores_r],
                       [self.yields[k] for k in self.stores_r])
        if self.stores_q:
            self.phase(self.Q, lambda: [self.store(k) for k in self.stores_q],
                       [self.yields[k] for k in self.stores_q])
        for k in self.stores_p:
            self.store(k)

    def phase(self, dims: list[int], innermost, values, split=None) -> None:
        """A loop nest over dims that computes `values`' dependencies at the level of the
        innermost dim each varies along, then runs `innermost` at the innermost level.
        `split` = (lo, hi): the first dim runs over [lo, hi) only (a thread's chunk); the
        Q dim of `split_q` over its share only."""
        pos = {d: i for i, d in enumerate(dims)}
        levels: dict[int, list] = {}
        for v in self.deps(values):
            lv = max((pos[d] for d in self.var[v] if d in pos), default=-1)
            levels.setdefault(lv, []).append(v)
        for v in levels.get(-1, []):
            self.value(v)

        def go(j):
            if j == len(dims):
                innermost()
                return
            d = dims[j]

            def body(i):
                self.idx[d] = i
                self.scopes.append({})
                for v in levels.get(j, []):
                    self.value(v)
                go(j + 1)
                self.scopes.pop()
                del self.idx[d]

            if j == 0 and split is not None:
                for_range(self.b, split[0], split[1], body, name=f"p{d}")
            elif self.split_q is not None and d == self.split_q[0]:
                for_range(self.b, *self.split_q[1:], body, name=f"q{d}")
            else:
                loop(self.b, self.shape.space[d], body, name=f"d{d}")

        go(0)

    def reduce_phase(self, reds, split=None, base: ir.Value | None = None) -> None:
        """One reduction level's accumulators, initialized, then the loop nest that fills
        them: over `split`'s rows only, into column accumulators at `base`, where given."""
        b = self.b
        dt = {op: op.result.type.dtype for op in reds}
        loop_rq = [d for d in range(len(self.shape.space)) if d in self.R or d in self.Q]
        qsize = _prod([self.shape.space[d] for d in self.Q])
        base = base if base is not None else self.scratch
        inner = self._short_inner_row(loop_rq)
        slots = self.shape.space[inner] if inner is not None else 1
        for op in reds:
            t = S.REG[dt[op]]
            init = S.identity(op.attributes["kind"], dt[op])
            if self.column:
                arr = (stack_array(b, t, qsize, "acc") if base is None else
                       self._accumulators(b, base, op))
                loop(b, qsize, lambda i, arr=arr, init=init, t=t: b.store(
                    init, elem(b, arr, t, i)), name="ai")
            else:
                arr = stack_array(b, t, slots, "acc")
                loop(b, slots, lambda i, arr=arr, init=init, t=t: b.store(
                    init, elem(b, arr, t, i)), name="ai")
            self.acc[op] = arr

        def accumulate():
            off = (self.q_offset() if self.column else
                   self.idx[inner] if inner is not None else i64(0))
            for op in reds:
                t = S.REG[dt[op]]
                p = elem(b, self.acc[op], t, off)
                x = self.value(op.operands[0])
                b.store(S.combine(b, op.attributes["kind"], b.load(p, typ=t), x, dt[op],
                                  flags=S.REASSOC), p)

        self.phase(loop_rq, accumulate, [op.operands[0] for op in reds], split)
        if not self.column:
            for op in reds:
                t, kind = S.REG[dt[op]], op.attributes["kind"]
                total = self.acc[op]  # the slots folded into the first
                loop(b, slots - 1, lambda i, total=total, t=t, kind=kind, d=dt[op]: b.store(
                    S.combine(b, kind, b.load(total, typ=t),
                              b.load(elem(b, total, t, b.add(i, i64(1))), typ=t), d,
                              flags=S.REASSOC), total), name="af")
                self.scopes[-1][op.result] = b.load(total, typ=t)

    def _short_inner_row(self, loop_rq: list[int]) -> int | None:
        """A row kernel's innermost reduced dim, where it is short (`SHORT_INNER`) inside
        another reduced dim: it then accumulates into a slot per position along it,
        folded after, so that the vectorized inner loop's partial sums are not reduced
        across lanes on every turn of the outer loop (a chain of shuffles and adds each
        time: BatchNorm's statistics over [c, n, 8x8], in cache, 0.57 -> 0.36 ms)."""
        if self.column or len(loop_rq) < 2 or loop_rq[-1] not in self.R:
            return None
        return loop_rq[-1] if self.shape.space[loop_rq[-1]] <= SHORT_INNER else None

    def q_offset(self) -> ir.Value:
        off, stride = i64(0), 1
        for d in reversed(self.Q):
            off = self.b.add(off, self.b.mul(self.idx[d], i64(stride)))
            stride *= self.shape.space[d]
        return off

    def offset(self, m: list[int]) -> ir.Value:
        b, off = self.b, None
        for d, s in enumerate(m):
            if s and self.shape.space[d] > 1:
                t = self.idx[d] if s == 1 else b.mul(self.idx[d], i64(s))
                off = t if off is None else b.add(off, t)
        return off if off is not None else i64(0)

    def store(self, k: int) -> None:
        v = self.value(self.yields[k])
        S.store(self.b, self.outs[k], self.out_dtypes[k], self.offset(self.shape.outs[k]), v)

    def value(self, v: Value) -> ir.Value:
        for scope in reversed(self.scopes):
            if v in scope:
                return scope[v]
        b = self.b
        if v.owner is self.block:
            k = v.index
            r = S.load(b, self.ins[k], self.in_dtypes[k], self.offset(self.shape.ins[k]))
        else:
            op = v.op
            a = op.attributes
            name = op.name
            if name == "kernel.constant":
                r = S.const(v.type.dtype, a["value"])
            elif name == "kernel.index":
                d = self.shape.index[a["dim"]]
                r = i64(0) if d is None else self.idx[d]
            elif name == "kernel.dropout":
                x, step, *coords = (self.value(u) for u in op.operands)
                r = dropout(b, x, step, coords, a, v.type.dtype, a.get("rows", 0))
            elif name == "kernel.reduce":  # a column accumulator, read at this q
                t = S.REG[v.type.dtype]
                r = b.load(elem(b, self.acc[op], t, self.q_offset()), typ=t)
            else:
                args = [self.value(x) for x in op.operands]
                src = op.operands[1 if name == "kernel.select" else 0].type.dtype
                r = S.emit(b, "ember." + name.removeprefix("kernel."), a, args, src)
        self.scopes[-1][v] = r
        return r


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _emitter(op, name: str) -> FusedEmitter:
    a = op.attributes
    return FusedEmitter(op.regions[0].blocks[0], a["space"], a["maps"], a["out_maps"],
                        [v.type.dtype for v in op.operands], [t.dtype for t in a["out_types"]],
                        name)


def emit_fused(b: ir.IRBuilder, op, outs: list, ins: list, threads: int, name: str,
               scratch: ir.Value | None = None) -> None:
    """A `kernel.fused` op at b's position (outs/ins: buffer pointers; `scratch`: its
    `fused_scratch` bytes)."""
    _emitter(op, name).emit(b, ins, outs, threads, scratch)


def fused_scratch(op, threads: int = 1) -> int:
    """The scratch bytes a `kernel.fused` op's kernel needs on `threads` (0: none)."""
    return _emitter(op, "scratch").scratch_bytes(threads)

