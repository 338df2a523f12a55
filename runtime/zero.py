"""ZeRO stage 1 (`compile_train_step(..., data_parallel=comm, shard_optimizer=True)`): each
rank keeps the optimizer state of 1/N of the params and updates those alone.

Params are dealt to ranks whole, largest first, each to the rank holding the fewest
elements so far: PyTorch's ZeroRedundancyOptimizer partitions the same way, so a param's
update never spans ranks and per-param rules (weight decay, Adam's moments) are unchanged.
A step (runtime/data_parallel.py): the gradient graph writes its gradients into a flat
buffer laid out by bucket (passes/bucket_grads.py) and, within one, by owner; each
bucket's reduce-scatter, begun as soon as the backward has finished it, leaves each rank
the sums of its own params' gradients (the loss, metrics and buffers are allreduced, as
unsharded); the update graph
of its own params runs (clipping's global norm is one allreduce of each rank's sum of
squares, the update itself compiled without clipping); then one all-gather of the param
arena, where every trainable param lives in the same layout on every rank, brings each
rank the others' new params, in place. Gradients stay whole on every rank (that would be
ZeRO-2).

Checkpoints hold the whole state: before rank 0 writes, every owner broadcasts its state,
so the file loads into any world size, sharded or not; a rank that loads one keeps only
its own params' state (the rest is dropped at its next update).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..frontend.param import Param
from ..ir import numpy_dtype
from .backend import to_host
from .distributed import Communicator
from .flat import Flat, Item, lay_out

_CHUNK = 1 << 20  # elements per float64 block of the sum of squares


@dataclass(frozen=True)
class Shards:
    """Which rank updates each trainable param (by the graph's param id)."""

    owner: dict[str, int]
    world_size: int

    @classmethod
    def deal(cls, table: dict[str, Param], world_size: int) -> Shards:
        """Largest first, each to the least-loaded rank (ties: the lowest rank, the
        table's order): the same on every rank, as it reads only the model."""
        trainable = [(pid, p.size) for pid, p in table.items() if p.requires_grad]
        load, owner = [0] * world_size, {}
        for pid, size in sorted(trainable, key=lambda t: -t[1]):
            rank = load.index(min(load))
            owner[pid] = rank
            load[rank] += size
        return cls({pid: owner[pid] for pid, _ in trainable}, world_size)

    def of_rank(self, rank: int) -> list[str]:
        return [pid for pid, r in self.owner.items() if r == rank]


class ParamArena:
    """Every trainable param's value as a view of one flat buffer per dtype, segments by
    owner: one all-gather after the update makes every rank's params current."""

    def __init__(self, shards: Shards, table: dict[str, Param]):
        items = [Item(pid, table[pid].shape, numpy_dtype(table[pid].dtype), rank)
                 for pid, rank in shards.owner.items()]
        self.flats: list[Flat]
        self.flats, self.views = lay_out(items, shards.world_size)

    def adopt(self, table: dict[str, Param], set_param: Callable,
              ids: list[str] | None = None) -> None:
        """Bind every param (or those of `ids`) to its view, copying in a value given
        since (the first update, a loaded checkpoint, a user's assignment, an update)."""
        for pid in self.views if ids is None else ids:
            view, value = self.views[pid], table[pid].val()
            if value is not view:
                np.copyto(view, to_host(value))
                set_param(table, pid, view)

    def gather(self, comm: Communicator, table: dict[str, Param], mine: list[str],
               set_param: Callable) -> None:
        """This rank's new params into their views, then everyone's to every rank."""
        self.adopt(table, set_param, mine)
        for flat in self.flats:
            comm.all_gather_(flat.buffer, flat.counts)


def sum_of_squares(arrays: list[np.ndarray]) -> float:
    """sum(a**2) over all `arrays`, accumulated in float64 block by block (a norm over a
    large model's gradients, which f32 would round by more than the clip it decides)."""
    total = 0.0
    for a in arrays:
        flat = a.reshape(-1)
        for start in range(0, flat.size, _CHUNK):
            block = flat[start:start + _CHUNK].astype(np.float64)
            total += float(block @ block)
    return total


def clip_coefficient(comm: Communicator, own_grads: list[np.ndarray], scale: float,
                     clip_norm: float) -> float:
    """PyTorch's clip_grad_norm_ factor, min(1, clip / (||all grads * scale|| + 1e-6)),
    over every rank's gradients: one allreduce of each rank's sum of squares."""
    total = np.array([sum_of_squares(own_grads)])
    comm.allreduce_(total)
    norm = float(np.sqrt(total[0])) * scale + 1e-6
    return min(clip_norm / norm, 1.0)


def keep_own_state(opt, table: dict[str, Param], mine: list[str]) -> None:
    """Drop the optimizer state of params another rank updates (a loaded checkpoint
    holds all of it)."""
    own = {table[pid].id for pid in mine}
    for param_id in [k for k in opt.state if k not in own]:
        del opt.state[param_id]


def gathered_state(comm: Communicator, opt, table: dict[str, Param], shards: Shards) -> dict:
    """Every param's optimizer state, as its owner holds it, on every rank: each owner in
    turn broadcasts a JSON header (the param's position in the table, which the ranks
    share where their random ids differ; slot, shape, dtype) and its arrays' bytes."""
    state: dict = {}
    pids = list(table)
    position = {pid: n for n, pid in enumerate(pids)}
    for rank in range(shards.world_size):
        arrays, header = [], []
        if rank == comm.rank:
            for pid in shards.of_rank(rank):
                for slot, value in sorted(opt.state.get(table[pid].id, {}).items()):
                    a = np.ascontiguousarray(to_host(value))
                    arrays.append(a)
                    header.append([position[pid], slot, list(a.shape), a.dtype.str])
        text = _broadcast_bytes(comm, json.dumps(header).encode(), rank)
        payload = _broadcast_bytes(comm, b"".join(a.tobytes() for a in arrays), rank)
        start = 0
        for n, slot, shape, dtype in json.loads(text):
            count = int(np.prod(shape, dtype=np.int64))
            value = np.frombuffer(payload, dtype, count, start).reshape(shape).copy()
            state.setdefault(table[pids[n]].id, {})[slot] = value
            start += count * np.dtype(dtype).itemsize
    return state


def _broadcast_bytes(comm: Communicator, data: bytes, root: int) -> bytes:
    """`data` of rank `root`, on every rank: its length, then its bytes."""
    length = comm.broadcast_(np.array([len(data)], np.int64), root)
    buffer = np.frombuffer(data, np.uint8).copy() if comm.rank == root \
        else np.empty(int(length[0]), np.uint8)
    return comm.broadcast_(buffer, root).tobytes()


@contextmanager
def full_state(opt, state: dict):
    """`opt.state` as `state` (a checkpoint's writer reads it), then its own again."""
    own, opt.state = opt.state, state
    try:
        yield
    finally:
        opt.state = own


__all__ = ["ParamArena", "Shards", "clip_coefficient", "full_state", "gathered_state",
           "keep_own_state", "sum_of_squares"]
