"""Data-parallel training steps: every rank runs the step on its shard of the global batch.

A step is two compiled graphs with one collective between them: the gradient graph
(forward and backward, as `compile_grad` compiles it) writes its gradients, and the loss,
scalar metrics and float buffers (BatchNorm's running stats), into one persistent flat
buffer per dtype; one allreduce sums it across ranks; the update graph (the optimizer
pass, as a compiled step lowers it) reads the summed gradients in place, scaled by
1/world_size, so clipping sees the global norm of the averaged gradients and the new
params and optimizer state are the same on every rank. Dropout draws, on each rank, the
mask of its rows of the global batch (the rank is the rng's shard: interpreter/rng.py;
exact where the batch is the outermost dimension of the dropped tensor). With a
mean-reduced loss and equal shards, that is single-process training on the global batch.

At the first step the ranks compare their traced graphs (ids and seeds aside) and fail
together, naming the ranks that differ, if the models or shapes disagree; then rank 0's
params and buffers are broadcast, so replicas start equal even from different seeds.
Averaged buffers keep the replicas equal; the batch statistics themselves are each
rank's own (as PyTorch's DDP without SyncBatchNorm) unless the layer is
`BatchNorm(sync=True)`, whose `ember.allreduce` ops sum through this step's communicator
in the middle of the gradient graph (backends/collectives.py).

With `accumulate=k` (runtime/accumulate.py) the gradient graph also adds each gradient to
this rank's buffers (`accumulate-grads`); calls 1..k-1 of a cycle run no collective
(SyncBatchNorm's aside) and return the rank's own loss; the k-th writes the buffers' sums
into the flat buffer, reduces it once and updates with the gradients scaled by
1/(world_size * k): the ranks' k micro-batches as one global batch.

Under precision="16-mixed" each rank's backward starts from the loss scale (every rank
holds the same scaler), and the update graph divides the summed gradients by it and skips
the update where any is not finite (passes/optimizer.py), alike on every rank; sharded,
the ranks first agree whether all of everyone's share is finite (one allreduce of a
count), so a shard's overflow skips every rank's update. The scaler learns the outcome.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..backends import collectives
from ..frontend.module import Module
from ..frontend.param import random_seed
from ..ir import Graph, has_trait, numpy_dtype
from ..ir.printer import strip_locations
from .accumulate import accumulation_pipeline
from .backend import to_host
from .compiled import Entry, one_call_at_a_time
from .distributed import Communicator, Pending
from .flat import Flat, Item, lay_out
from .params import param_values, state_key
from .pipeline import SIMPLIFY, Stages, grad_pipeline
from .precision import with_precision
from .steps import TrainStep
from .update import UpdateLayout, hyper_inputs, state_inputs, update_graph, write_back
from .zero import (
    ParamArena,
    Shards,
    clip_coefficient,
    full_state,
    gathered_state,
    keep_own_state,
)


@dataclass
class FlatBuffers:
    """Where the reduced results of one gradient graph sit: one buffer per dtype, and a
    view of it for each result position (the loss, scalar metrics, buffers, gradients).
    A buffer's first segment holds what every rank averages (`head`); then the gradients,
    one span per bucket (`ember.grad_buckets`, passes/bucket_grads.py), each reduced as
    soon as the backward has finished it (`start`, while the backward goes on) where the
    kernels write its gradients in place, else after the run. Sharded (ZeRO-1), a bucket's
    span is one segment per rank, the gradients of the params it updates, and the bucket
    is reduce-scattered: each rank gets the sums of its own segments."""

    flats: list[Flat]
    views: dict[int, np.ndarray]  # result position -> its place, in the result's shape
    head: list[int]  # positions averaged here (not by the update graph): loss, metrics, buffers
    world: int  # segments per bucket: world_size when sharded, else 1
    buckets: list[list[tuple[np.ndarray, list[int]]]]  # per bucket, per buffer: (span, counts)
    early: frozenset[int]  # the buckets `start` reduces during the run
    pending: list[Pending] = field(default_factory=list)

    @classmethod
    def of(cls, entry: Entry, shards: Shards | None = None,
           direct: frozenset[int] = frozenset()) -> FlatBuffers:
        """`shards`: which rank updates each param, when the optimizer is sharded;
        `direct`: the result positions the kernels write into their views."""
        types = [v.type for v in entry.graph.return_op.operands]
        main, buffers, grads = entry.split(list(range(len(types))))
        scalars = [k for k in main if types[k].shape == ()]
        head = [k for k in scalars + buffers if types[k].dtype.startswith(("f", "bf"))]
        ids = entry.graph.attributes["ember.grads"]
        buckets = entry.graph.attributes.get("ember.grad_buckets", [list(range(len(grads)))])
        bucket_of = {j: b for b, js in enumerate(buckets) for j in js}
        world = shards.world_size if shards else 1
        segment = [1 + bucket_of[j] * world + (shards.owner[pid] if shards else 0)
                   for j, pid in enumerate(ids)]
        items = [Item(k, types[k].shape, numpy_dtype(types[k].dtype), 0) for k in head]
        items += [Item(k, types[k].shape, numpy_dtype(types[k].dtype), segment[j])
                  for j, k in enumerate(grads)]
        flats, views = lay_out(items, 1 + len(buckets) * world)
        spans = []
        for b in range(len(buckets)):
            first = 1 + b * world
            spans.append([(flat.buffer[sum(flat.counts[:first]):
                                       sum(flat.counts[:first + world])],
                           flat.counts[first:first + world])
                          for flat in flats if any(flat.counts[first:first + world])])
        early = frozenset(b for b, js in enumerate(buckets)
                          if all(grads[j] in direct for j in js))
        return cls(flats, views, head, world, spans, early)

    def _reduce_start(self, comm: Communicator, bucket: int) -> list[Pending]:
        return [comm.reduce_scatter_start(span, counts) if self.world > 1
                else comm.allreduce_start(span) for span, counts in self.buckets[bucket]]

    def start(self, comm: Communicator, bucket: int) -> None:
        """The backward has finished `bucket`: begin its reduction, if its gradients are
        in place already."""
        if bucket in self.early:
            self.pending += self._reduce_start(comm, bucket)

    def reduce(self, comm: Communicator) -> None:
        """Sum every rank's buffers: the head, each bucket `start` did not begin, then wait
        for those it did; unsharded with none begun, one allreduce a buffer."""
        started, self.pending = self.pending, []
        if not started and self.world == 1:
            for flat in self.flats:
                comm.allreduce_(flat.buffer)
            return
        for flat in self.flats:
            if flat.counts[0]:
                comm.allreduce_(flat.buffer[:flat.counts[0]])
        begun = self.early if started else frozenset()
        for b in range(len(self.buckets)):
            if b not in begun:
                for p in self._reduce_start(comm, b):
                    p.wait()
        for p in started:
            p.wait()


class DataParallelStep(TrainStep):
    """`compile_train_step(..., data_parallel=True | communicator)`: a TrainStep whose
    gradients are averaged across the ranks of `comm` before the update. Each rank passes
    its rows of every argument, the model's inputs and the loss function's alike
    (`n_inputs`). With `shard_optimizer`, each rank keeps the optimizer state of its share
    of the params and updates those alone (ZeRO-1: runtime/zero.py). `bucket_bytes`: the
    most gradient bytes reduced at once while the backward goes on (DDP's bucket_cap_mb)."""

    bucket_bytes = 25 << 20

    def __init__(self, model: Module, loss_fn: Callable, optimizer, comm: Communicator,
                 shard_optimizer: bool = False, **options):
        super().__init__(model, loss_fn, optimizer, **options)
        if shard_optimizer and self.on_device:
            raise ValueError("shard_optimizer runs on host backends (cpu, interpreter): its "
                             "collectives move numpy arrays")
        self.comm = comm
        self.shard_optimizer = bool(shard_optimizer)
        self._zero: tuple[tuple, Shards, ParamArena] | None = None  # (params' key, ...)
        self.rng_shard = comm.rank  # dropout draws the mask of its rows of the global batch
        self._flat: dict[int, FlatBuffers] = {}  # id(entry) -> its flat buffers
        self._updates: dict[tuple, tuple] = {}  # key -> (graph, run, layout)
        self._synced = False
        self._dropout_seed: int | None = None  # rank 0's, agreed at the first trace

    def _trace(self, specs: tuple) -> Graph:
        """The training trace, its random ops seeded as rank 0 seeds them (each rank's
        own seed would draw masks unrelated to one another)."""
        graph = super()._trace(specs)
        if self._dropout_seed is None:
            seed = np.array([random_seed()], np.int64)
            self._dropout_seed = int(self.comm.broadcast_(seed, root=0)[0])
        for op in graph.ops:
            if has_trait(op.name, "random") and "seed" in op.attributes:
                op.attributes["seed"] = self._dropout_seed
        return graph

    def pipeline(self):
        if self.accumulator is not None:  # every call: the gradients added to the buffers
            passes = accumulation_pipeline(None, self.accumulate, self.linear, self.recompute,
                                           self.memory_budget)
        else:
            passes = grad_pipeline(self.linear, self.recompute, self.memory_budget)
        passes = with_precision(passes, self.precision, scale_loss=self.scaler is not None)
        if self.on_device:  # reduced after the run
            return passes
        return [*passes, f"bucket-grads{{bytes={self.bucket_bytes}}}"]

    def _phase(self) -> str | None:
        return None  # one gradient graph, whichever call of a cycle runs it

    @one_call_at_a_time
    def __call__(self, *inputs: np.ndarray):
        # first, and on every update: what each rank brings (a rank whose batch shapes or
        # optimizer settings differ would otherwise wait in another collective until the
        # timeout, or train a replica that silently drifts away); accumulating, a call that
        # only adds to the buffers runs no collective (but SyncBatchNorm's)
        opt, acc = self.optimizer, self.accumulator
        update = acc is None or acc.updates_next
        if update:
            self.comm.check_same(
                "the step (batch shapes, optimizer settings)",
                repr(([(np.shape(x), str(getattr(x, "dtype", type(x)))) for x in inputs],
                      opt.config(), opt.lr, opt.step_count, self.pending)),
                "every rank passes batches of the same shapes to the same optimizer settings")
        table = self.param_table()
        entry = self.entry(inputs, table)
        flat = self._flat.get(id(entry))
        if flat is None:  # a new graph: every rank must have built the same one
            self.comm.check_same("the traced training graph", _fingerprint(entry))
            self._flat = {id(e): self._flat[id(e)] for e in self._cache.values()
                          if id(e) in self._flat}
            flat = self._flat[id(entry)] = FlatBuffers.of(
                entry, self.shards(table), getattr(entry.run, "direct_results", frozenset()))
        if not self._synced:
            self.broadcast_params(table)
            self._synced = True
        if not entry.native_checks:
            self.check_inputs(entry, inputs)
        params = self.params(table)
        args = self.arguments(entry, inputs) + self.extra_inputs(entry, table)
        direct = update and getattr(entry.run, "writes_out", False)
        # SyncBatchNorm's sums (ember.allreduce); updating, each bucket of gradients is
        # reduced as soon as the backward has finished it (ember.grads_ready)
        with collectives.using(self.comm.allreduce_), collectives.on_grads_ready(
                lambda bucket: flat.start(self.comm, bucket) if direct else None):
            outs = self.run(entry, args, params, out=flat.views if direct else None)
        if self.detect_anomaly:
            self.check_finite(entry, args, params, outs)
        if not update:  # this rank's loss and buffers; its gradients summed into the buffers
            acc.keep(entry, table, self.finish(entry, table, outs))
            return self.loss if not self.metrics else (self.loss, *self.metrics)
        if not direct:
            for k, view in flat.views.items():
                np.copyto(view, to_host(outs[k]))
        flat.reduce(self.comm)
        scale = 1.0 / self.comm.world_size
        outs = list(outs)
        for k in flat.head:
            flat.views[k] *= scale
            outs[k] = flat.views[k].copy()  # a buffer's new value outlives this step
        grads = [flat.views[k] for k in range(len(outs) - entry.tail, len(outs))]
        self.finish(entry, table, outs)
        self.update(table, entry.graph.attributes["ember.grads"], grads)
        if acc is not None:
            acc.reset()
        return self.loss if not self.metrics else (self.loss, *self.metrics)

    def shards(self, table: dict) -> Shards | None:
        """Which rank updates each param (None unless `shard_optimizer`), dealt again when
        the params change (their shapes, which of them train)."""
        if not self.shard_optimizer:
            return None
        key = state_key(table)
        if self._zero is None or self._zero[0] != key:
            shards = Shards.deal(table, self.comm.world_size)
            self._zero = (key, shards, ParamArena(shards, table))
        return self._zero[1]

    def update(self, table: dict, ids: list[str], grads: list[np.ndarray]) -> None:
        """The optimizer's update from the summed gradients (of every rank and, with
        `accumulate=k`, of the k micro-batches: scaled by 1/(world_size * k)), compiled once
        per params; sharded, of this rank's params alone, then everyone's gathered."""
        scale = 1.0 / (self.comm.world_size * self.accumulate)
        shards = self.shards(table)
        if shards is None:  # the summed gradients, alike on every rank, say if all are finite
            self._learn(self._update(table, ids, grads, scale, clipping=True))
            return
        assert self._zero is not None
        arena, opt = self._zero[2], self.optimizer
        by_id = dict(zip(ids, grads))
        mine = [pid for pid in shards.of_rank(self.comm.rank) if pid in by_id]
        own_grads = [by_id[pid] for pid in mine]
        if self.scaler is not None and not self._all_finite(own_grads):
            self._learn(False)  # every rank skips, whichever shard overflowed
            return
        if opt.clip_norm:
            unscale = 1.0 / self.scaler.scale if self.scaler is not None else 1.0
            coef = clip_coefficient(self.comm, own_grads, scale * unscale, opt.clip_norm)
            if coef < 1.0:
                for g in own_grads:
                    g *= g.dtype.type(coef)
        arena.adopt(table, self.set_param)
        keep_own_state(opt, table, mine)
        self._learn(self._update(table, mine, own_grads, scale, clipping=False))
        arena.gather(self.comm, table, mine, self.set_param)

    def _all_finite(self, own_grads: list[np.ndarray]) -> bool:
        """Whether every rank's gradients are finite (one allreduce of a count)."""
        bad = np.array([sum(not np.isfinite(g).all() for g in own_grads)], np.float64)
        self.comm.allreduce_(bad)
        return bad[0] == 0

    def _learn(self, finite: bool) -> None:
        """16-mixed: the scaler learns whether the update ran (as every rank decides)."""
        if self.scaler is not None:
            self.skipped = not finite
            self.scaler.update(finite)

    def _update(self, table: dict, ids: list[str], grads: list[np.ndarray], scale: float,
                clipping: bool) -> bool:
        """Run the update graph of params `ids` (compiled once per params and settings);
        returns whether it ran (16-mixed: not where some gradient was not finite)."""
        if not ids:  # a rank that owns no param still counts the step
            self.optimizer.step_count += 1
            return True
        scaled = self.scaler is not None
        key = (state_key(table), self.key_extra(), tuple(ids), scale, clipping, scaled)
        found = self._updates.get(key)
        if found is None:
            graph = update_graph(self.optimizer, table, list(ids), scale, clipping, scaled)
            stages = Stages(graph, [*SIMPLIFY, "fuse"])
            found = (stages.graph, self.backend.compile(stages.graph),
                     UpdateLayout.of(stages.graph))
            if len(self._updates) >= self.cache_size:
                self._updates.clear()
            self._updates[key] = found
        graph, run, layout = found
        lr_dtype = next(a for a in graph.args if a.name == "lr").type.dtype
        args = (grads + ([np.array(self.scaler.scale, np.float32)] if scaled else [])
                + hyper_inputs(self.optimizer, lr_dtype)
                + state_inputs(self.optimizer, layout, table))
        outs = run(args, self.params(table))
        at = graph.attributes.get("ember.grads_finite")
        finite = at is None or bool(to_host(outs[at]))
        write_back(self.optimizer, layout, table, outs, self.set_param, count=finite)
        return finite

    def broadcast_params(self, table: dict) -> None:
        """Rank 0's params and buffers to every rank (flags stay each rank's own)."""
        params = [(pid, p) for pid, p in table.items() if p.kind != "flag"]
        values = param_values(dict(params))
        by_dtype: dict[np.dtype, list[str]] = {}
        for pid, _ in params:
            by_dtype.setdefault(values[pid].dtype, []).append(pid)
        for dtype, pids in by_dtype.items():
            flat = np.concatenate([values[pid].ravel() for pid in pids]).astype(dtype)
            self.comm.broadcast_(flat, root=0)
            start = 0
            for pid in pids:
                n = values[pid].size
                self.set_param(table, pid, flat[start:start + n].reshape(values[pid].shape)
                               .copy())
                start += n

    def save_checkpoint(self, path: str, extra: dict | None = None) -> str:
        """Rank 0 writes the checkpoint (replicas are equal; sharded, each owner's optimizer
        state gathered first); every rank returns once the file is in place.
        Mid-accumulation, the ranks' gradient buffers differ: the file holds their sum (one
        allreduce of copies; the live buffers are left as they are)."""
        pending, grads = super().accumulated()
        grads = {pid: np.array(g) for pid, g in grads.items()}  # copies, summed in place
        for g in grads.values():
            self.comm.allreduce_(g)
        self._saving = (pending, grads)
        table = self.param_table()
        shards = self.shards(table)
        state = self.optimizer.state if shards is None else gathered_state(
            self.comm, self.optimizer, table, shards)
        try:
            if self.comm.rank == 0:
                with full_state(self.optimizer, state):
                    super().save_checkpoint(path, extra)
        finally:
            self._saving = None
        self.comm.barrier()
        return path

    def load_checkpoint(self, path: str, parse_extra: Callable | None = None):
        """Every rank loads the same file (written by rank 0 of a run of any world size,
        sharded or not: a sharded step keeps its own params' state); ranks given different
        files fail together before anything changes."""
        self.comm.check_same("the checkpoint file resumed from", file_digest(path),
                             "every rank loads the same checkpoint file")
        return super().load_checkpoint(path, parse_extra)

    def accumulated(self) -> tuple[int, dict]:
        """Mid-save, the buffers summed over the ranks (`save_checkpoint`)."""
        saving = getattr(self, "_saving", None)
        return saving if saving is not None else super().accumulated()

    def restore_accumulated(self, pending: int, grads: dict) -> None:
        """A checkpoint's buffers hold every rank's sum: rank 0 takes them, the others
        start from zero, so the next reduction sums the same gradients (in another order:
        equal up to f32 rounding)."""
        if self.comm.rank != 0:
            grads = {pid: np.zeros_like(g) for pid, g in grads.items()}
        super().restore_accumulated(pending, grads)


def file_digest(path: str) -> str:
    """SHA-256 of a file's bytes (or why it cannot be read: the ranks compare that too)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 24):
                h.update(block)
    except OSError as e:
        return f"unreadable: {type(e).__name__}"
    return h.hexdigest()


def _fingerprint(entry: Entry) -> str:
    """The traced graph with what legitimately differs between ranks left out: param ids
    (random unless seeded)."""
    text = strip_locations(entry.stages.text("traced"))  # paths may differ between hosts
    for n, pid in enumerate(dict.fromkeys(re.findall(r'\bid = "([^"]+)"', text))):
        text = text.replace(f'"{pid}"', f'"param{n}"')
    return text + repr([(s.shape, s.dtype) for s in entry.specs])


__all__ = ["DataParallelStep", "FlatBuffers"]
