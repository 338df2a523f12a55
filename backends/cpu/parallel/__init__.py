"""Threads: the process-wide pool of workers (pool.py) and the outlining of a kernel's
outer loop into chunks the pool runs (outline.py)."""
