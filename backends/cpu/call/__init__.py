"""Running compiled code: the Executable (native code plus the buffers it owns,
executable.py; the rows it binds per call, rows.py; timing and profiling its native call,
timing.py), aligned storage and guard pages (buffers.py), the graph's input checks
compiled into the entry (input_checks.py), and the bound call a training loop makes every
step (bound.py), whose array checks and input binding run natively (binding.py)."""
