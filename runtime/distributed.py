"""Communicators: the collectives a data-parallel step needs, on the engine users launch.

`init(backend="auto")` joins the process group that the launcher describes in the
environment: torchrun (and Slurm's `srun torchrun`, Kubernetes' PyTorchJob, Ray Train's
TorchTrainer, which all set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) → "gloo", through
torch.distributed; mpiexec/srun with MPI (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK) →
"mpi", through mpi4py; neither → "local", one process. Arrays are numpy arrays reduced in place.

A peer that dies or never joins makes the collective fail with `DistributedError` after
`timeout` seconds at most (gloo; MPI has no timeout: its launcher ends the job), never a
hang. `close()` leaves the group (and runs at exit: torch aborts a process that exits
with a live gloo group).
"""

from __future__ import annotations

import atexit
import hashlib
import os
from collections.abc import Callable
from datetime import timedelta

import numpy as np

from ..settings import DIST_TIMEOUT

DEFAULT_TIMEOUT = DIST_TIMEOUT.default  # seconds; EMBER_DIST_TIMEOUT overrides it


class DistributedError(RuntimeError):
    """A collective failed: a peer died, timed out or disagrees with this rank."""


class Pending:
    """A collective under way: `wait()` returns once it is done (or raises its error)."""

    def __init__(self, wait: Callable[[], object]):
        self._wait = wait

    def wait(self) -> None:
        self._wait()


class Communicator:
    """One process of a group of `world_size`: `allreduce_` sums in place across ranks,
    `broadcast_` copies rank `root`'s array into everyone's. The sharded collectives
    (ZeRO-1, runtime/zero.py) see a flat array as consecutive segments, one per rank, of
    `counts[r]` elements: `reduce_scatter_` leaves in this rank's segment the sum of
    everyone's, `all_gather_` fills every segment with its owner's."""

    backend = "local"
    rank, world_size = 0, 1

    def allreduce_(self, array: np.ndarray) -> np.ndarray:
        return array

    def broadcast_(self, array: np.ndarray, root: int = 0) -> np.ndarray:
        return array

    def allreduce_start(self, array: np.ndarray) -> Pending:
        """`allreduce_` begun: the sum is in `array` once the returned handle's `wait()`
        returns (here at once; gloo and MPI reduce while the caller computes on)."""
        self.allreduce_(array)
        return Pending(lambda: None)

    def reduce_scatter_(self, array: np.ndarray, counts: list[int]) -> np.ndarray:
        """Here by `allreduce_` (every segment summed): right for any communicator, the
        backends below move only the segments."""
        return self.allreduce_(array)

    def reduce_scatter_start(self, array: np.ndarray, counts: list[int]) -> Pending:
        """`reduce_scatter_` begun (here, and on MPI, done at once; gloo reduces while the
        caller computes on)."""
        self.reduce_scatter_(array, counts)
        return Pending(lambda: None)

    def all_gather_(self, array: np.ndarray, counts: list[int]) -> np.ndarray:
        """Here by `allreduce_` of the array with every other rank's segments zeroed."""
        if self.world_size > 1:
            mine = self.segment(array, counts).copy()
            array[:] = 0
            self.segment(array, counts)[:] = mine
            self.allreduce_(array)
        return array

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass

    def segment(self, array: np.ndarray, counts: list[int], rank: int | None = None) -> np.ndarray:
        """Rank `rank`'s (this rank's) segment of a flat array of `counts` segments."""
        rank = self.rank if rank is None else rank
        start = sum(counts[:rank])
        return array[start:start + counts[rank]]

    def check_same(self, what: str, fingerprint: str, hint: str = "every rank must build the "
                   "same model and pass batches of the same shapes") -> None:
        """Fail on every rank, naming the ranks that differ, unless all ranks hold the same
        `fingerprint` (a model's traced graph, a step's batch shapes and settings): one
        allreduce of each rank's 48-bit digest in its own slot (exact in float64)."""
        if self.world_size == 1:
            return
        digests = np.zeros(self.world_size, np.float64)
        digests[self.rank] = int.from_bytes(hashlib.sha256(fingerprint.encode()).digest()[:6],
                                            "little")
        self.allreduce_(digests)
        ranks = np.nonzero(digests != digests[0])[0].tolist()
        if ranks:
            raise DistributedError(f"{what} differs between ranks: rank 0 and rank(s) {ranks} "
                                   f"({hint})")

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{self.backend} communicator: rank {self.rank} of {self.world_size}>"


class GlooCommunicator(Communicator):
    """torch.distributed with the gloo backend; numpy arrays are shared with torch, not
    copied (torch.from_numpy)."""

    backend = "gloo"

    def __init__(self, timeout: float):
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            raise DistributedError("the gloo backend runs on torch.distributed: install the "
                                   "extra, pip install 'ember[distributed]'") from None
        self._torch, self._dist, self.timeout = torch, dist, timeout
        self._owned = not dist.is_initialized()
        if self._owned:
            missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                       if k not in os.environ]
            if missing:
                raise DistributedError(f"gloo needs {', '.join(missing)} in the environment: "
                                       "launch with torchrun (python -m torch.distributed.run)")
            try:
                dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
            except Exception as e:  # noqa: BLE001  (torch raises several kinds)
                raise DistributedError(
                    f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} could not join "
                    f"the process group at {os.environ['MASTER_ADDR']}:"
                    f"{os.environ['MASTER_PORT']} within {timeout:g} s (did every rank "
                    f"start?): {type(e).__name__}: {e}") from None
            atexit.register(self.close)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def _collective(self, name: str, run):
        try:
            return run()
        except Exception as e:  # noqa: BLE001
            raise DistributedError(f"rank {self.rank}: {name} across {self.world_size} ranks "
                                   f"failed (a peer died, or did not answer within "
                                   f"{self.timeout:g} s): {type(e).__name__}: {e}") from None

    def allreduce_(self, array):
        t = self._torch.from_numpy(array)
        self._collective("allreduce", lambda: self._dist.all_reduce(t))
        return array

    def broadcast_(self, array, root=0):
        t = self._torch.from_numpy(array)
        self._collective("broadcast", lambda: self._dist.broadcast(t, src=root))
        return array

    def allreduce_start(self, array):
        t = self._torch.from_numpy(array)  # held by the handle until the sum is in
        work = self._collective("allreduce", lambda: self._dist.all_reduce(t, async_op=True))
        return Pending(lambda: self._collective("allreduce", lambda: (work.wait(), t)))

    def reduce_scatter_(self, array, counts):
        self.reduce_scatter_start(array, counts).wait()
        return array

    def reduce_scatter_start(self, array, counts):
        torch = self._torch
        segments = [torch.from_numpy(self.segment(array, counts, r))
                    for r in range(self.world_size)]
        mine = torch.empty_like(segments[self.rank])  # gloo's output must not alias an input
        work = self._collective("reduce_scatter", lambda: self._dist.reduce_scatter(
            mine, segments, async_op=True))

        def finish():
            work.wait()
            segments[self.rank].copy_(mine)

        return Pending(lambda: self._collective("reduce_scatter", finish))

    def all_gather_(self, array, counts):
        """gloo gathers equal sizes only: every segment padded to the longest."""
        torch, longest = self._torch, max(counts)
        own = torch.zeros(longest, dtype=torch.from_numpy(array[:0]).dtype)
        own[:counts[self.rank]] = torch.from_numpy(self.segment(array, counts))
        padded = own.new_empty(self.world_size * longest)
        self._collective("all_gather",
                         lambda: self._dist.all_gather_single(padded, own))
        for r in range(self.world_size):
            self.segment(array, counts, r)[:] = padded[r * longest:][:counts[r]].numpy()
        return array

    def barrier(self):
        self._collective("barrier", self._dist.barrier)

    def close(self):
        if self._owned and self._dist.is_initialized():
            self._dist.destroy_process_group()
        self._owned = False


class MpiCommunicator(Communicator):
    """mpi4py's COMM_WORLD (shared memory between local ranks: several times faster than
    gloo's TCP for large arrays)."""

    backend = "mpi"

    def __init__(self):
        try:
            from mpi4py import MPI
        except ImportError:
            raise DistributedError("the mpi backend needs mpi4py and an MPI library: pip "
                                   "install 'ember[mpi]'") from None
        self._mpi, self._comm = MPI, MPI.COMM_WORLD
        self.rank, self.world_size = self._comm.Get_rank(), self._comm.Get_size()

    def allreduce_(self, array):
        self._comm.Allreduce(self._mpi.IN_PLACE, array, op=self._mpi.SUM)
        return array

    def broadcast_(self, array, root=0):
        self._comm.Bcast(array, root=root)
        return array

    def allreduce_start(self, array):
        request = self._comm.Iallreduce(self._mpi.IN_PLACE, array, op=self._mpi.SUM)
        return Pending(request.Wait)

    def reduce_scatter_(self, array, counts):
        mine = np.empty_like(self.segment(array, counts))
        self._comm.Reduce_scatter(array, mine, recvcounts=counts, op=self._mpi.SUM)
        self.segment(array, counts)[:] = mine
        return array

    def all_gather_(self, array, counts):
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
        self._comm.Allgatherv(self._mpi.IN_PLACE, [array, (counts, starts)])
        return array

    def barrier(self):
        self._comm.Barrier()


BACKENDS = ("auto", "gloo", "mpi", "local")


def detect() -> str:
    """The backend the environment's launcher implies."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return "gloo"
    if any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")):
        return "mpi"
    return "local"


def init(backend: str = "auto", timeout: float | None = None) -> Communicator:
    """Join the process group of this run; `timeout` (seconds, default EMBER_DIST_TIMEOUT
    or 300) bounds how long a collective waits for a peer."""
    if backend not in BACKENDS:
        raise ValueError(f"distributed backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if timeout is None:
        timeout = DIST_TIMEOUT.get()
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    backend = detect() if backend == "auto" else backend
    if backend == "gloo":
        return GlooCommunicator(timeout)
    if backend == "mpi":
        return MpiCommunicator()
    return Communicator()


__all__ = ["Communicator", "DistributedError", "Pending", "detect", "init"]
