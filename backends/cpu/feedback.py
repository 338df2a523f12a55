"""A compiled graph run again and again with some results fed back as the next call's
inputs (a training step's new params and optimizer state), bound once rather than per call.

The fed results and the inputs they become take turns between two sets of the
executable's pooled result buffers: one call reads set A and writes set B, the next reads
B and writes A. Each turn has a buffer table of its own, bound once, so a call binds only
what is new (the batch when it is another array, the lr, the results nobody feeds back),
after two checks that keep `run_values`' contract: every fed input is the very array the
previous call returned for it, and no one else holds the arrays it would write (the
pool's refcount rule). Any other call runs `run_values`' general path and binds the two
tables again from what that call bound (after a user replaced a param, on the first
calls, while a caller holds a returned array). The other tensor inputs and params are
kept by identity (a reference held, so an id is never reused) and bound again when
another object comes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from operator import attrgetter, is_, itemgetter

import numpy as np

_first = itemgetter(0)
_layout = attrgetter("shape", "dtype")


class _Turn:
    """One of the two turns: its table, the pool entries it reads and writes, and the
    entries of its results where they are fed back (`(None,)` where each call picks one)."""

    def __init__(self, table, reads: list, writes: list, results: list):
        self.table, self.reads, self.writes, self.results = table, reads, writes, results
        self.pointer = ctypes.c_void_p(ctypes.addressof(table))  # cheaper to pass than table


class Feedback:
    """`run(inputs, values)`: `exe.run_values(inputs, values)`, result for result, for
    a caller that feeds result `r` back as the input `feeds[r]` names (an argument's
    position, or a param's key) on the next call."""

    def __init__(self, exe, feeds: Mapping[int, int | str]):
        self.exe = exe
        args = {row[1]: row for row in exe._args}
        params = {row[1]: (j, row) for j, row in enumerate(exe._params)}
        fed_args = {r: k for r, k in feeds.items() if k in args}
        fed_params = {r: k for r, k in feeds.items() if k in params}
        self.carries = bool(feeds) and exe._handed is not None \
            and len(fed_args) + len(fed_params) == len(feeds) \
            and len(set(feeds.values())) == len(feeds) \
            and all(exe.slots[exe._results[r][0]].type == (args[k] if r in fed_args
                                                           else params[k][1])[4]
                    for r, k in feeds.items())
        # fed inputs: arguments first, then params (as `_fed` gathers them)
        self._fed_args = list(fed_args.values())
        self._fed_values = [params[k][0] for k in fed_params.values()]
        self._fed = [*fed_args, *fed_params]  # their results' positions
        fed_rows = [args[k] for k in fed_args.values()] \
            + [params[k][1] for k in fed_params.values()]
        self._in_slots = [row[0] for row in fed_rows]
        self._fed_layouts = [(row[3], row[2]) for row in fed_rows]  # (shape, dtype)
        self._out_slots = [exe._results[r][0] for r in self._fed]
        # what each call binds unless it is the object the last call bound
        fed_positions = set(fed_args.values())
        self._args = [row for row in exe._args if row[1] not in fed_positions]
        self._arg_pos = [row[1] for row in self._args]
        fed_keys = set(fed_params.values())
        self._params = [row for row in exe._params if row[1] not in fed_keys]
        self._value_pos = [params[row[1]][0] for row in self._params]
        self._layouts = [(row[3], row[2]) for row in self._params]
        self._held_args: list = [None] * len(self._args)
        self._held_values: list = [None] * len(self._params)
        self._kept: dict[int, np.ndarray] = {}  # slot -> the array bound there (converted)
        self._pool_of = dict(exe._pools)
        self._pools = [(r, i, self._pool_of[i]) for r, (i, *_) in enumerate(exe._results)
                       if r not in feeds]
        self._turns: list[_Turn] | None = None
        self._tables: list | None = None
        self._turn = 0

    def __call__(self, inputs: Sequence, values: Sequence) -> list[np.ndarray]:
        exe = self.exe
        with exe._lock:
            turn = self._ready(inputs, values)
            if turn is not None:
                exe._bind_scalars(inputs)
                if not all(map(is_, map(inputs.__getitem__, self._arg_pos), self._held_args)):
                    self._bind(inputs, self._args, self._arg_pos, self._held_args)
                params = list(map(values.__getitem__, self._value_pos))
                if not (all(map(is_, params, self._held_values))
                        and list(map(_layout, params)) == self._layouts):
                    self._bind(values, self._params, self._value_pos, self._held_values,
                               params=True)
                table, results = turn.table, list(map(_first, turn.results))
                for r, i, pool in self._pools:
                    entry = exe._take(i, pool)
                    results[r], table[i] = entry[0], entry[2]
                exe._call(turn.pointer)
                self._turn ^= 1
                return results
        return self._general(inputs, values)

    def _ready(self, inputs: Sequence, values: Sequence) -> _Turn | None:
        """This call's turn when it may run bound: every fed input the array the last call
        returned for it, of the same shape and dtype still (either may be set in place),
        and every array it writes free."""
        turn = self._turns[self._turn] if self._turns is not None else None
        if turn is None or len(inputs) != self.exe._n_args \
                or len(values) != len(self.exe.param_keys):
            return None
        fed = [*map(inputs.__getitem__, self._fed_args),
               *map(values.__getitem__, self._fed_values)]
        if all(map(is_, fed, map(_first, turn.reads))) \
                and list(map(_layout, fed)) == self._fed_layouts and self.exe._free(turn.writes):
            return turn
        return None

    def _bind(self, source: Sequence, rows: list, positions: list, held: list,
              params: bool = False) -> None:
        """Bind `source`'s values at `positions` to their slots in both turns' tables."""
        for k, (row, pos) in enumerate(zip(rows, positions)):
            x = source[pos]
            if x is None and params:
                raise KeyError(f"no value for {row[5]}")
            bound, address = self.exe._bind(x, row)
            for turn in self._turns:
                turn.table[row[0]] = address
            self._kept[row[0]] = bound
            held[k] = x if bound is x else None  # a converted copy is made again next call

    def _spare(self, slot: int, used: set) -> tuple:
        """A pool entry of result slot `slot` whose id is not in `used` (a new one if
        none)."""
        pool = self._pool_of[slot]
        spare = next((e for e in pool if id(e) not in used), None)
        return spare if spare is not None else self.exe._new_result(slot, pool)

    def _general(self, inputs: Sequence, values: Sequence) -> list[np.ndarray]:
        """`run_values`, then both turns bound again from what it bound."""
        exe = self.exe
        arrays = exe._run(inputs, values)
        results = exe._collect(arrays)
        if self.carries:
            self._bind_turns(inputs, values, arrays, results)
        return results

    def _bind_turns(self, inputs, values, arrays: list, results: list) -> None:
        """The next call reads the fed results and writes the buffers this one read (or,
        where it read a caller's array or one buffer twice, another of the pool's); the
        one after it the other way round. None when a result is not one of the pool's (all
        of them held)."""
        pooled = self.exe._pooled
        reads = [pooled.get(id(results[r])) for r in self._fed]
        if any(e is None for e in reads):
            self._turns = None
            return
        writes: list = []
        used = set(map(id, reads))
        for i, o in zip(self._in_slots, self._out_slots):
            e = pooled.get(id(arrays[i]))
            if e is None or id(e) in used:
                e = self._spare(o, used)
            writes.append(e)
            used.add(id(e))
        ptrs = self.exe._ptrs
        if self._tables is None:  # allocated once: a general call binds them again
            self._tables = [(ctypes.c_void_p * len(ptrs))() for _ in range(2)]
        turns = []
        for table, (r, w) in zip(self._tables, ((reads, writes), (writes, reads))):
            ctypes.memmove(table, ptrs, ctypes.sizeof(table))
            for i, o, er, ew in zip(self._in_slots, self._out_slots, r, w):
                table[i], table[o] = er[2], ew[2]
            entries = [(None,)] * len(results)  # each call picks those left
            for pos, e in zip(self._fed, w):
                entries[pos] = e
            turns.append(_Turn(table, r, w, entries))

        self._turns, self._turn = turns, 0
        self._kept = {}
        for rows, positions, source, held in (
                (self._args, self._arg_pos, inputs, self._held_args),
                (self._params, self._value_pos, values, self._held_values)):
            for k, (row, pos) in enumerate(zip(rows, positions)):
                x = source[pos]
                held[k] = x if arrays[row[0]] is x else None
                self._kept[row[0]] = arrays[row[0]]
