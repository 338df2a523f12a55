"""Flash attention on the cpu: `kernel.attention` (forward.py, which also plans the
blocking), `kernel.attention_grad` (backward.py), and the register tiles both are made of
(tiles.py)."""
