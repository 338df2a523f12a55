"""Graphs for the checkpointing and memory tests, built with ir.builder (what a trace of the
frontend layers produces, without depending on the frontend)."""

from __future__ import annotations

import math

import numpy as np

from ember.ir import Builder, Graph, TensorType, Value

T = TensorType


class Net:
    """A builder that hands out params by name and records their shapes."""

    def __init__(self, name: str, args: list[tuple[str, tuple, str]], dtype: str = "f32"):
        self.graph = Graph(name, [T(s, d) for _, s, d in args], [n for n, _, _ in args])
        self.b = Builder(self.graph.body)
        self.dtype = dtype
        self.shapes: dict[str, tuple] = {}
        self.kinds: dict[str, str] = {}

    def param(self, path: str, shape, kind: str | None = None, **attrs) -> Value:
        self.shapes[path] = tuple(shape)
        self.kinds[path] = kind or "float"
        extra = {"kind": kind} if kind else {}
        return self.b.create("ember.param", [], {"id": path, "path": path, **extra, **attrs},
                             result_types=[T(tuple(shape), self.dtype)]).result

    def op(self, name: str, *operands: Value, **attrs) -> Value:
        return self.b.op(name, *operands, **attrs)

    def linear(self, x: Value, d_in: int, d_out: int, path: str, bias: bool = True,
               **attrs) -> Value:
        w = self.param(f"{path}.weight", (d_in, d_out), **attrs)
        bs = [self.param(f"{path}.bias", (d_out,), **attrs)] if bias else []
        return self.op("nn.linear", x, w, *bs)

    def ret(self, *values: Value) -> Graph:
        self.b.create("func.return", list(values))
        return self.graph

    def values(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Deterministic param values (running variances positive)."""
        rng = np.random.default_rng(seed)
        out = {}
        for path, shape in self.shapes.items():
            if path.endswith("running_var"):
                out[path] = rng.uniform(0.5, 1.5, shape)
            else:
                out[path] = rng.normal(size=shape) / math.sqrt(max(1, shape[0]))
        return {k: v.astype(np.float32 if self.dtype == "f32" else np.float64)
                for k, v in out.items()}


def mixed(n: int = 4, c: int = 3, hw: int = 8, width: int = 16, classes: int = 5,
          p: float = 0.25, dtype: str = "f32") -> Net:
    """Conv2d -> BatchNorm2d (training) -> GELU -> max pool -> tokens -> LayerNorm ->
    causal attention -> Dropout -> residual -> mean over tokens -> Linear -> cross-entropy.
    Results: (loss, new running mean, new running var)."""
    net = Net("mixed", [("x", (n, c, hw, hw), dtype), ("y", (n,), "i64"), ("rng", (), "i64")],
              dtype)
    x, y, rng = net.graph.args
    conv = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1)
    h = net.op("nn.conv2d", x, net.param("conv.weight", (width, c, 3, 3)),
               net.param("conv.bias", (width,)), **conv)
    bn = net.b.create("nn.batch_norm", [h, net.param("bn.gamma", (width,)),
                                        net.param("bn.beta", (width,)),
                                        net.param("bn.running_mean", (width,), "buffer"),
                                        net.param("bn.running_var", (width,), "buffer")],
                      dict(eps=1e-5, momentum=0.1, training=True))
    h, new_mean, new_var = bn.results
    h = net.op("nn.gelu", h, approximate="none")
    h = net.op("ember.max_pool2d", h, kernel=[2, 2], stride=[2, 2], padding=[0, 0])
    tokens = (hw // 2) ** 2
    t = net.op("ember.transpose", net.op("ember.reshape", h, shape=[n, width, tokens]),
               perm=[0, 2, 1])
    t = net.op("nn.layer_norm", t, net.param("ln.gamma", (width,)), net.param("ln.beta", (width,)),
               axes=[-1], eps=1e-5, affine=True)
    q, k, v = (net.linear(t, width, width, f"attn.{s}", bias=False) for s in "qkv")
    a = net.op("nn.attention", q, k, v, causal=True, scale=1 / math.sqrt(width))
    a = net.op("ember.dropout", a, rng, p=p, seed=7, key=1)
    t = net.op("ember.add", t, a)
    pooled = net.op("ember.reduce_mean", t, axes=[1], keepdims=False)
    logits = net.linear(pooled, width, classes, "head")
    loss = net.op("nn.cross_entropy", logits, y)
    net.graph.attributes["ember.buffer_updates"] = ["bn.running_mean", "bn.running_var"]
    net.graph.attributes["ember.rng"] = 2
    net.ret(loss, new_mean, new_var)
    return net


def mlp(blocks: int = 16, width: int = 512, batch: int = 256, classes: int = 10,
        activation: str = "gelu", frozen: tuple[str, ...] = ()) -> Net:
    """`blocks` x (Linear -> activation), then a Linear head and cross-entropy."""
    net = Net("mlp", [("x", (batch, width), "f32"), ("y", (batch,), "i64")])
    h, y = net.graph.args
    for i in range(blocks):
        path = f"fc{i + 1}"
        attrs = {"requires_grad": False} if path in frozen else {}
        h = net.linear(h, width, width, path, **attrs)
        h = (net.op("nn.gelu", h, approximate="none") if activation == "gelu"
             else net.op(f"ember.{activation}", h))
    logits = net.linear(h, width, classes, "head")
    net.ret(net.op("nn.cross_entropy", logits, y))
    return net
