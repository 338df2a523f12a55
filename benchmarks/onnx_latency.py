"""Inference latency of ONNX-imported models: ember against onnxruntime, one process.

Run: `python benchmarks/onnx_latency.py` (`--only bert,gpt2,vit,resnet18,resnet18-b8,
mobilenetv2,mobilenetv3`, `--quick`). Each model is a transformers model built from its
config with random weights (BERT-base on input_ids, attention_mask and token_type_ids at
T 128; GPT-2 small's GPT2Model at T 128; ViT-tiny on a 224 x 224 image: hidden 192, 12
layers, 3 heads, patch 16; ResNet-18 (torchvision's layout: basic blocks 64-512) at
224 x 224, batch 1 and 8; MobileNetV2 at 224 x 224), or MobileNetV3-small at 224 x 224
written out in benchmarks/mobilenetv3.py (torchvision's layers and classifier: its wheel
does not load against the CPU torch), batch 1 unless said, exported by
`torch.onnx.export(..., dynamo=False, opset_version=17)`, loaded with `em.onnx.load` and
compiled with `em.compile` on the cpu backend, and run by an onnxruntime session (default
options, intra-op threads = the machine's cores). The two are timed in interleaved blocks
(timing.interleaved) after their outputs were compared; the table shows each one's median
latency, ember's speed over onnxruntime's (above 1: ember is faster), and ember's GFLOP/s
(the compiled graph's GEMMs and attention: 2 flops a multiply-add) as a share of the
machine's measured FMA peak (timing.machine). Skips, saying so, without transformers,
onnxruntime or onnx.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import math
import os
import warnings

import numpy as np
import timing
from timing import calls_for, interleaved, machine, median_time

MODELS = ("bert", "gpt2", "vit", "resnet18", "resnet18-b8", "mobilenetv2", "mobilenetv3")
T = 128


def build(name: str):
    """(torch model returning its last hidden state, input names, inputs) of a model."""
    import torch
    import transformers

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if name == "mobilenetv3":
        from mobilenetv3 import mobilenet_v3_small

        return mobilenet_v3_small(), ("pixel_values",), [
            rng.standard_normal((1, 3, 224, 224)).astype(np.float32)]
    ids = rng.integers(0, 1000, (1, T)).astype(np.int64)
    ones = np.ones((1, T), np.int64)
    if name == "bert":
        model = transformers.BertModel(transformers.BertConfig())
        names, xs = ("input_ids", "attention_mask", "token_type_ids"), [ids, ones, 0 * ones]
    elif name == "gpt2":
        model = transformers.GPT2Model(transformers.GPT2Config(use_cache=False))
        names, xs = ("input_ids", "attention_mask"), [ids, ones]
    else:
        batch = 8 if name.endswith("-b8") else 1
        if name == "vit":
            cfg = transformers.ViTConfig(hidden_size=192, num_hidden_layers=12,
                                         num_attention_heads=3, intermediate_size=768,
                                         patch_size=16, image_size=224)
            model = transformers.ViTModel(cfg, add_pooling_layer=False)
        elif name.startswith("resnet18"):
            model = transformers.ResNetModel(transformers.ResNetConfig(
                layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                embedding_size=64))
        else:
            model = transformers.MobileNetV2Model(transformers.MobileNetV2Config())
        names = ("pixel_values",)
        xs = [rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)]

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model.eval()

        def forward(self, *args):
            return self.m(**dict(zip(names, args))).last_hidden_state

    return Hidden().eval(), names, xs


def export(model, names, xs) -> bytes:
    """The ONNX bytes of `model` on `xs` (TorchScript exporter, opset 17)."""
    import torch

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(torch.from_numpy(x) for x in xs), f, dynamo=False,
                          opset_version=17, input_names=list(names), output_names=["y"])
    return f.getvalue()


def graph_flops(graph) -> int:
    """Flops of the compiled graph's GEMMs, convolutions and attention (2 per
    multiply-add)."""
    total = 0
    for op in graph.body.ops:
        a = op.attributes
        if op.name == "kernel.matmul":
            total += 2 * math.prod(a["space"])
        elif op.name == "ember.matmul":
            total += 2 * math.prod(op.result.type.shape) * op.operands[0].type.shape[-1]
        elif op.name in ("ember.conv2d", "kernel.conv2d"):  # (with an epilogue: over space)
            _, cg, kh, kw = op.operands[1].type.shape
            out = a["space"] if op.name == "kernel.conv2d" else op.result.type.shape
            total += 2 * math.prod(out) * cg * kh * kw
        elif op.name == "ember.conv2d_nhwc":  # (weight [kh, kw, c/groups, o])
            total += 2 * math.prod(op.result.type.shape) * math.prod(
                op.operands[1].type.shape[:3])
        elif op.name == "kernel.attention":
            tq, tk, d, dv = a["sizes"]
            total += 2 * math.prod(a["batch"]) * tq * tk * (d + dv)
    return total


def bench(name: str, cores: int, torch_too: bool = False) -> tuple:
    """(name, median seconds of ember, onnxruntime and, with `torch_too`, PyTorch eager
    and torch.compile on the model exported, ember's GFLOP/s, output difference)."""
    import onnxruntime as ort

    import ember as em

    model, names, xs = build(name)
    data = export(model, names, xs)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = cores
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    feeds = dict(zip(names, xs))
    forward = em.compile(em.onnx.load(data), *xs, backend="cpu")
    want, got = sess.run(None, feeds)[0], forward(*xs)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    if err > 1e-3:
        raise AssertionError(f"{name}: ember's output differs from onnxruntime's by {err:.1e}")
    fns = {"ember": lambda: forward(*xs), "ort": lambda: sess.run(None, feeds)}
    if torch_too:
        import torch

        inputs = [torch.from_numpy(x) for x in xs]
        for label, run in (("torch eager", model), ("torch.compile", torch.compile(model))):
            def call(run=run):
                with torch.inference_mode():
                    return run(*inputs)
            median_time(call, 1, 2)  # warm up (and compile)
            fns[label] = call
    number = calls_for(median_time(lambda: forward(*xs), 1, 3), 0.3)
    t = interleaved(fns, number)
    gflops = graph_flops(forward.graph) / t["ember"] / 1e9
    return name, t, gflops, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(MODELS))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    missing = [m for m in ("torch", "transformers", "onnx", "onnxruntime")
               if importlib.util.find_spec(m) is None]
    if missing:
        print(f"# skipped: {', '.join(missing)} not installed")
        return
    if args.quick:
        timing.REPEAT = 3
    m = machine()
    cores = m["cores"] or os.cpu_count() or 1
    print(f"# {m['cpu']}, {cores} cores: FMA peak {m['peak_gflops']:.0f} GFLOP/s; "
          f"load average {os.getloadavg()}")
    print(f"{'model':12s} {'ember ms':>9s} {'ort ms':>9s} {'ember/ort speed':>16s} "
          f"{'ember GFLOP/s':>14s} {'% of peak':>10s}")
    for name in args.only.split(","):
        name, t, gf, err = bench(name, cores)
        te, to = t["ember"], t["ort"]
        print(f"{name:12s} {te * 1e3:9.2f} {to * 1e3:9.2f} {to / te:15.2f}x {gf:14.1f} "
              f"{100 * gf / m['peak_gflops']:9.0f}%   (outputs within {err:.0e})", flush=True)


if __name__ == "__main__":
    main()
