"""Device strings ("cuda", "cuda:N") and the one availability check the backend runs
before anything else, so a machine without cupy, a driver, a GPU or NVRTC gets one clear
error at compile time instead of a crash deep in a kernel launch."""

from __future__ import annotations

import re


class CudaUnavailableError(RuntimeError):
    """The cuda backend cannot run here; the message names the cause and the fix."""


def parse_device(device: str | int | None = "cuda") -> int:
    """The GPU ordinal of "cuda" (0), "cuda:N" (N) or an int."""
    if device is None or device == "cuda":
        return 0
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return device
    m = re.fullmatch(r"cuda:(\d+)", str(device))
    if not m:
        raise ValueError(f"bad cuda device {device!r}: use \"cuda\" or \"cuda:N\"")
    return int(m.group(1))


def check_available(device: str | int | None = "cuda") -> int:
    """The ordinal of a usable GPU for `device`; CudaUnavailableError saying why not."""
    index = parse_device(device)
    try:
        import cupy
    except ImportError as e:
        raise CudaUnavailableError(
            f"backend 'cuda' needs cupy, which is not installed ({e}): "
            "pip install 'ember[gpu]' (cupy-cuda12x)") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # cupy_backends...CUDARuntimeError: no driver, or one too old
        raise CudaUnavailableError(
            f"backend 'cuda': cupy {cupy.__version__} is installed but there is no usable "
            f"GPU: the CUDA runtime reports {_short(e)} (no NVIDIA driver on this machine, "
            "or one too old for this cupy build)") from None
    if count == 0:
        raise CudaUnavailableError("backend 'cuda': the NVIDIA driver reports no GPU")
    if index >= count:
        raise CudaUnavailableError(f"backend 'cuda': device cuda:{index} does not exist "
                                   f"(this machine has {count} GPU{'s' if count > 1 else ''})")
    for what, probe, fix in (
            ("NVRTC, the CUDA runtime compiler that builds ember's kernels",
             lambda: cupy.cuda.nvrtc.getVersion(), "nvidia-cuda-nvrtc-cu12"),
            ("cuBLAS, which runs ember's matmuls",
             lambda: __import__("cupy_backends.cuda.libs.cublas"), "nvidia-cublas-cu12")):
        try:
            probe()
        except Exception as e:
            raise CudaUnavailableError(
                f"backend 'cuda': a GPU is present but cupy cannot load {what}: {_short(e)}; "
                f"install the CUDA toolkit or pip install {fix} "
                "(or cupy-cuda12x[ctk])") from None
    return index


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
