"""The loops of every op but matmul and attention: one element of each core op
(scalar.py, with vmath.py's vector exp/log/tanh/erf), loop nests (loops.py), fused
elementwise and reduction kernels (fused.py), one kernel per unfused op (unfused.py),
convolutions (conv.py), pooling and gather/scatter (spatial.py), dropout's hash
(dropout.py) and the allreduce's call out to Python (collective.py)."""
