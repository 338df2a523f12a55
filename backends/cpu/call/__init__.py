"""Running compiled code: the Executable (native code plus the buffers it owns,
executable.py), aligned storage and guard pages (buffers.py), the graph's input checks
compiled into the entry (input_checks.py), and the bound call a training loop makes every
step (bound.py), whose array checks and input binding run natively (binding.py)."""
