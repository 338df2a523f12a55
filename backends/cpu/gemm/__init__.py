"""Matrix multiply on the cpu: ember's own packed GEMM (emit.py, built of microkernel.py's
micro-kernel and B packing) and the call into OpenBLAS (blas.py), which of the two runs a
problem (cost.py, from speeds measured by timing.py and tune.py), and `kernel.matmul` with
its fused epilogue (matmul.py)."""
