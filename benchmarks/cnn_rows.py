"""benchmarks/run.py's CNN rows (issue 34): the ResNet-18 CIFAR training step (batch 32)
against PyTorch eager and torch.compile (benchmarks/resnet.py), and inference of ONNX
exports of ResNet-18 at 224 (batch 1 and 8), MobileNetV2 and MobileNetV3-small
(benchmarks/mobilenetv3.py) against onnxruntime, PyTorch eager and torch.compile
(benchmarks/onnx_latency.py); each also as % of the FMA peak. Then
MobileNetV2's depthwise convs channels last (the layout pass's form) and in NCHW, as the
bytes they move per second against the bandwidth of a copy far past the caches; and
ResNet-18 CIFAR's 3x3 convs (batch 32), forward and both gradients, as direct-conv
FLOPs per second against the peak (an effective rate: Winograd does fewer multiplies)."""

from __future__ import annotations

import importlib.util

import onnx_latency
import resnet

# MobileNetV2's depthwise convs: (size, channels, stride), 3x3, padded as TF pads
DEPTHWISE = [(112, 32, 1), (112, 96, 2), (56, 144, 1), (28, 192, 1), (14, 576, 1),
             (7, 960, 1)]


# ResNet-18 CIFAR's 3x3 convs at batch 32: (channels in, out, size, stride, how many)
CONV3X3 = [(64, 64, 32, 1, 4), (64, 128, 32, 2, 1), (128, 128, 16, 1, 3),
           (128, 256, 16, 2, 1), (256, 256, 8, 1, 3), (256, 512, 8, 2, 1), (512, 512, 4, 1, 3)]


def bench_cnn(rows: list, peak: float, cores: int) -> None:
    bench_conv3x3(rows, peak)
    if importlib.util.find_spec("torch") is None:
        rows.append(("CNN rows", "skipped", "no torch", "", ""))
        return
    bench_depthwise(rows)
    times = resnet.step_times(32, 32)
    _rows(rows, "ResNet-18 CIFAR b32 SGD step", times, resnet.conv_flops(32, 32), peak)
    missing = [m for m in ("transformers", "onnx", "onnxruntime")
               if importlib.util.find_spec(m) is None]
    if missing:
        rows.append(("CNN inference (ONNX)", "skipped", f"no {', '.join(missing)}", "", ""))
        return
    for name in ("resnet18", "resnet18-b8", "mobilenetv2", "mobilenetv3"):
        _, times, gflops, _ = onnx_latency.bench(name, cores, torch_too=True)
        times["onnxruntime"] = times.pop("ort")
        _rows(rows, f"{name} 224 inference", times, gflops * times["ember"] * 1e9, peak)


def bench_depthwise(rows: list) -> None:
    """Each conv's kernel time inside one native call (so no result is allocated), its
    bytes (input, weight and output, once each) per second, as % of the copy bandwidth."""
    bandwidth = copy_bandwidth()
    rows.append(("copy past the caches", f"{bandwidth / 1e9:10.1f} GB/s", "", "", ""))
    for size, c, stride in DEPTHWISE:
        out = (size - 1) // stride + 1
        pad = [0, 0, 1, 1] if stride == 2 else [1, 1]
        t = _kernel_time(_conv("ember.conv2d_nhwc", stride, pad, c),
                         [(1, size, size, c), (3, 3, 1, c)], "conv2d_nhwc")
        edge = size + 1 if stride == 2 else size  # (NCHW: the end padding copied in)
        t_nchw = _kernel_time(_conv("ember.conv2d", stride, [2 - stride] * 2, c),
                              [(1, c, edge, edge), (c, 1, 3, 3)], "conv2d")
        moved = 4 * (size * size * c + 9 * c + out * out * c)
        rows.append((f"depthwise {size}x{size}x{c} s{stride}", f"{t * 1e3:10.3f} ms",
                     f"NCHW {t_nchw * 1e3:8.3f}", f"x{t_nchw / t:5.2f}",
                     f"{moved / t / 1e9:5.1f} GB/s = {100 * moved / t / bandwidth:3.0f}% "
                     "of copy"))


def bench_conv3x3(rows: list, peak: float, batch: int = 32) -> None:
    """Each 3x3 conv's forward, input and weight gradient kernels in one graph; the last
    row sums them as the network has them."""
    import numpy as np

    total_t = total_flops = 0.0
    for c, o, size, stride, count in CONV3X3:
        a = {"stride": [stride] * 2, "padding": [1, 1], "dilation": [1, 1], "groups": 1}
        xs, ws, ys = (batch, c, size, size), (o, c, 3, 3), (batch, o, size // stride,
                                                             size // stride)

        def graph(b, x, w, dy, a=a, xs=xs, ws=ws):
            return [b.create("ember.conv2d", [x, w], a).result,
                    b.create("ember.conv2d_grad_input", [dy, w],
                             {**a, "input_shape": list(xs)}).result,
                    b.create("ember.conv2d_grad_weight", [x, dy],
                             {**a, "weight_shape": list(ws)}).result]

        from run import compiled  # (run.py imports this file)

        exe = compiled(graph, [xs, ws, ys])
        inputs = [np.random.default_rng(0).standard_normal(s, dtype=np.float32)
                  for s in (xs, ws, ys)]
        runs = [dict(exe.profile(inputs, repeat=5)) for _ in range(3)]
        t = sum(min(r[k] for r in runs) for k in runs[0] if "conv" in k)
        flops = 3 * 2 * o * c * 9 * ys[0] * ys[2] * ys[3]
        total_t, total_flops = total_t + count * t, total_flops + count * flops
        rows.append((f"conv3x3 {c}->{o} {size}x{size} s{stride} fwd+bwd", f"{t * 1e3:10.2f} ms",
                     f"{flops / t / 1e9:6.0f} GFLOP/s", "",
                     f"{100 * flops / t / 1e9 / peak:4.0f}% of peak" if peak else ""))
    rows.append(("conv3x3 ResNet-18 CIFAR, all", f"{total_t * 1e3:10.2f} ms",
                 f"{total_flops / total_t / 1e9:6.0f} GFLOP/s", "",
                 f"{100 * total_flops / total_t / 1e9 / peak:4.0f}% of peak" if peak else ""))


def _conv(name: str, stride: int, padding: list[int], groups: int):
    return lambda b, x, w: [b.op(name, x, w, stride=[stride] * 2, padding=padding,
                                 dilation=[1, 1], groups=groups)]


def copy_bandwidth() -> float:
    """Bytes read and written per second by an elementwise kernel (negation, on every
    thread) over 256 MB, far past any cache."""
    n = 1 << 26
    return 2 * 4 * n / _kernel_time(lambda b, x: [b.op("ember.neg", x)], [(n,)], "fused")


def _kernel_time(graph_fn, shapes, kind: str) -> float:
    import numpy as np
    from run import compiled  # (run.py imports this file)

    exe = compiled(graph_fn, shapes)
    inputs = [np.random.default_rng(0).standard_normal(s, dtype=np.float32) for s in shapes]
    return min(t for name, t in exe.profile(inputs) if name.endswith(kind))


def _rows(rows: list, label: str, times: dict, flops: float, peak: float) -> None:
    """One row per contender: ember's time and % of peak, the other's, ember's speedup."""
    t_em = times.pop("ember")
    share = f"{100 * flops / t_em / 1e9 / peak:4.0f}% of peak" if peak else ""
    for other, t in times.items():
        rows.append((label, f"{t_em * 1e3:10.2f} ms", f"{other} {t * 1e3:8.2f}",
                     f"x{t / t_em:5.2f}", share))
