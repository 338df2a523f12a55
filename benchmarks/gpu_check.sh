#!/usr/bin/env bash
# The GPU check of the cuda backend, for a machine with an NVIDIA GPU, its driver and
# cupy-cuda12x (pip install -e '.[gpu]'): every GPU test, then the GPU benchmark.
# Under 5 minutes on an H100/H200. Run from anywhere: benchmarks/gpu_check.sh
# The log also goes to $OUT/gpu_check.log when $OUT is set (a device runner's output dir).
set -u
cd "$(dirname "$0")/.."
LOG=${OUT:+$OUT/gpu_check.log}
exec > >(tee ${LOG:-/dev/null}) 2>&1
start=$SECONDS
status=0

# not installed (a GPU machine with no package index: pip cannot fetch ember's build
# requirements): import the checkout itself as `ember`
if ! python -c "import ember" 2>/dev/null; then
  mkdir -p /tmp/ember-src && ln -sfn "$PWD" /tmp/ember-src/ember
  export PYTHONPATH=/tmp/ember-src${PYTHONPATH:+:$PYTHONPATH}
fi

echo "== environment"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader
python - <<'PY'
import sys
print("python", sys.version.split()[0])
try:
    import cupy
    print("cupy", cupy.__version__)
except ImportError as e:
    print("cupy is not installed:", e, "-> pip install -e '.[gpu]'")
    sys.exit(0)
from ember.backends import cuda
try:
    print("cuda backend: usable, device", cuda.check_available())
except cuda.CudaUnavailableError as e:
    print("cuda backend: NOT usable:", e)
PY

echo "== GPU tests (op parity with the interpreter, fused attention, digits MLP/CNN >= 97%, dropout masks)"
# -rs lists every skip with its reason: on a GPU machine no GPU test may be skipped.
timeout 210 python -m pytest -q -p no:warnings -rs -o cache_dir=/tmp/ember-pytest-cache \
  tests/backends/test_cuda_ops.py tests/backends/test_cuda_training.py \
  tests/backends/test_cuda_codegen.py tests/backends/test_cuda_attention.py \
  tests/backends/test_cuda_cublas.py || status=1

echo "== GPT on the GPU (losses against the cpu backend and torch cuda, ms per step)"
timeout 90 python benchmarks/gpu_gpt.py --config A --steps 20 || status=1
echo "== GPT B in bf16-mixed (cuBLAS bf16 tensor-core GEMMs) against torch cuda autocast"
timeout 120 python benchmarks/gpu_gpt.py --config B --steps 20 --precision bf16-mixed || status=1

echo "== GPU benchmark (ms per training step)"
timeout $(( 290 - (SECONDS - start) > 30 ? 290 - (SECONDS - start) : 30 )) \
  python benchmarks/gpu_bench.py --steps 50 || status=1

echo "== done in $((SECONDS - start)) s, status $status"
exit $status
