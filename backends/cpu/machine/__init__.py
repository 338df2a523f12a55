"""Machine code: what the host CPU is (host.py), LLVM IR optimized and loaded with
llvmlite's MCJIT (jit.py), and the on-disk cache of object code (cache.py)."""
