"""The machine the generated code runs on: CPU name and features, vector unit, caches,
threads.

A leaf, so that everything that tunes code for the host (the GEMM, the cost table, the
JIT's target machine, the compile cache's key) asks one place and imports nothing else.
`EMBER_NUM_THREADS` overrides the thread count (default: the CPUs this process may use).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import llvmlite.binding as llvm

from ....settings import AMX, NUM_THREADS


@functools.cache
def host_cpu() -> str:
    llvm.initialize_native_target()
    return llvm.get_host_cpu_name()


@functools.cache
def host_features() -> str:
    """The host's features, as the target machine takes them. On an AVX-512 host the loop
    vectorizer gets the full 512-bit registers that `host_isa` gives the GEMM: LLVM tunes
    Intel's server cores (Skylake-X to Emerald Rapids, not Zen 4) to prefer 256-bit loops,
    which left elementwise kernels at half width (tanh 1.3x, erf 1.5x slower on an Emerald
    Rapids), while the GEMM's explicit 512-bit vectors already pay any clock cost."""
    llvm.initialize_native_target()
    features = llvm.get_host_cpu_features()
    return features.flatten() + (",-prefer-256-bit" if features.get("avx512f") else "")


@dataclass(frozen=True)
class Isa:
    """The host's vector unit: register width in bits and register count; `bf16_tiles`:
    AMX's bf16 tile multiply is there and this process may use it (`host_amx`);
    `bf16_dot`: AVX512-BF16's dot products are."""

    bits: int
    regs: int
    bf16_tiles: bool = False
    bf16_dot: bool = False

    @property
    def bf16_gemm(self) -> bool:
        """Whether the GEMM multiplies bf16 operands itself (gemm/bf16.py)."""
        return self.bf16_tiles or self.bf16_dot

    def lanes(self, dtype: str) -> int:
        return self.bits // (32 if dtype == "f32" else 64)


@functools.cache
def host_isa() -> Isa:
    llvm.initialize_native_target()
    feats = llvm.get_host_cpu_features()
    triple = llvm.get_process_triple()
    if feats.get("avx512f"):
        return Isa(512, 32, host_amx(), bool(feats.get("avx512bf16")))
    if feats.get("avx2") or feats.get("avx"):
        return Isa(256, 16)
    return Isa(128, 32 if triple.startswith(("aarch64", "arm64")) else 16)


# Linux's arch_prctl request for the AMX tile data state (asm/prctl.h, fpu/xstate.h)
SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18


@functools.cache
def host_amx() -> bool:
    """Whether the GEMM may use AMX's bf16 tiles: the CPU has them (LLVM's host features),
    EMBER_AMX allows them, and Linux grants this process the tile state, which it asks
    for once (an x86-64 process must, or its first tile instruction is a SIGILL)."""
    llvm.initialize_native_target()
    feats = llvm.get_host_cpu_features()
    if not (AMX.get() and feats.get("amx-tile") and feats.get("amx-bf16")
            and sys.platform == "linux" and llvm.get_process_triple().startswith("x86_64")):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0


@dataclass(frozen=True)
class Caches:
    """One core's level-1 data and level-2 cache, in bytes: what the own GEMM's blocks fit."""

    l1d: int
    l2: int


# where the sizes cannot be read: a core of the last decade's x86 servers
DEFAULT_CACHES = Caches(32 << 10, 1 << 20)
CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


@functools.cache
def host_caches() -> Caches:
    """cpu0's caches as Linux reports them (sysfs), DEFAULT_CACHES for what it does not."""
    sizes = {}
    for index in sorted(CACHE_DIR.glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in
                                 ("level", "type", "size"))
            scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
            n = int(size.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and n > 0:
            sizes.setdefault(level, n)
    return Caches(sizes.get("1", DEFAULT_CACHES.l1d), sizes.get("2", DEFAULT_CACHES.l2))


def num_threads() -> int:
    n = NUM_THREADS.get()
    if n is not None:
        return max(1, n)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
