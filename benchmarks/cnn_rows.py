"""benchmarks/run.py's CNN rows (issue 34): the ResNet-18 CIFAR training step (batch 32)
against PyTorch eager and torch.compile (benchmarks/resnet.py), and inference of ONNX
exports of ResNet-18 at 224 (batch 1 and 8) and MobileNetV2 (standing in for
MobileNetV3-small, which needs torchvision) against onnxruntime, PyTorch eager and
torch.compile (benchmarks/onnx_latency.py); each also as % of the FMA peak."""

from __future__ import annotations

import importlib.util

import onnx_latency
import resnet


def bench_cnn(rows: list, peak: float, cores: int) -> None:
    if importlib.util.find_spec("torch") is None:
        rows.append(("CNN rows", "skipped", "no torch", "", ""))
        return
    times = resnet.step_times(32, 32)
    _rows(rows, "ResNet-18 CIFAR b32 SGD step", times, resnet.conv_flops(32, 32), peak)
    missing = [m for m in ("transformers", "onnx", "onnxruntime")
               if importlib.util.find_spec(m) is None]
    if missing:
        rows.append(("CNN inference (ONNX)", "skipped", f"no {', '.join(missing)}", "", ""))
        return
    for name in ("resnet18", "resnet18-b8", "mobilenetv2"):
        _, times, gflops, _ = onnx_latency.bench(name, cores, torch_too=True)
        times["onnxruntime"] = times.pop("ort")
        _rows(rows, f"{name} 224 inference", times, gflops * times["ember"] * 1e9, peak)


def _rows(rows: list, label: str, times: dict, flops: float, peak: float) -> None:
    """One row per contender: ember's time and % of peak, the other's, ember's speedup."""
    t_em = times.pop("ember")
    share = f"{100 * flops / t_em / 1e9 / peak:4.0f}% of peak" if peak else ""
    for other, t in times.items():
        rows.append((label, f"{t_em * 1e3:10.2f} ms", f"{other} {t * 1e3:8.2f}",
                     f"x{t / t_em:5.2f}", share))
