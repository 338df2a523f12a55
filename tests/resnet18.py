"""ResNet-18 at full size, in PyTorch and in ember, for the gradient accuracy tests: the CIFAR
stem (3x3 stride-1 conv, no pool) or the ImageNet stem (7x7 stride-2 conv, 3x3 stride-2
pool), then 4 stages of 2 basic blocks (64, 128, 256, 512 channels), a mean over the image
and a 10-way head.

The activation is SiLU and the stem's pool an average: ReLU and max pooling decide at a
point (is this pre-activation > 0, which window value is largest), and where a value lies
within float32 rounding of that point float32 and float64 decide differently, which moves
a whole output channel's gradient (a single flipped ReLU at 7x7 moves a weight gradient by
percents, in PyTorch as in ember). At 224x224 a network has millions of such decisions, so
a few always sit that close: a test of the arithmetic compares the smooth network. The
benchmark (benchmarks/resnet.py) times torchvision's ReLU version (`act="relu"`).
`torch_resnet18` builds the PyTorch twin of either."""

from __future__ import annotations

import numpy as np

from ember import nn

F = nn.functional
WIDTHS = (64, 128, 256, 512)


class Block(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, act: str = "silu"):
        super().__init__()
        self.act = getattr(F, act)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)
            self.down_bn = nn.BatchNorm2d(c_out)

    def forward(self, x):
        y = self.bn2(self.conv2(self.act(self.bn1(self.conv1(x)))))
        return self.act(y + (x if self.down is None else self.down_bn(self.down(x))))


class ResNet18(nn.Module):
    def __init__(self, stem: str = "cifar", act: str = "silu"):
        super().__init__()
        self.imagenet = stem == "imagenet"
        self.act = getattr(F, act)
        self.conv1 = (nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False) if self.imagenet
                      else nn.Conv2d(3, 64, 3, padding=1, bias=False))
        self.bn1 = nn.BatchNorm2d(64)
        blocks, c = [], 64
        for i, w in enumerate(WIDTHS):
            blocks += [Block(c, w, 1 if i == 0 else 2, act), Block(w, w, 1, act)]
            c = w
        self.blocks = blocks
        self.fc = nn.Linear(512, 10)

    def forward(self, x):
        x = self.act(self.bn1(self.conv1(x)))
        if self.imagenet:
            x = F.avg_pool2d(x, 3, 2, 1)
        for block in self.blocks:
            x = block(x)
        return self.fc(x.mean((2, 3)))


def torch_resnet18(stem: str = "cifar", act: str = "silu"):
    """ResNet18's PyTorch twin, laid out layer for layer as it is."""
    import torch

    tnn = torch.nn
    fn = getattr(tnn.functional, act)

    class TorchBlock(tnn.Module):
        def __init__(self, c_in, c_out, stride):
            super().__init__()
            self.conv1 = tnn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(c_out)
            self.conv2 = tnn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(c_out)
            self.down = None
            if stride != 1 or c_in != c_out:
                self.down = tnn.Conv2d(c_in, c_out, 1, stride, bias=False)
                self.down_bn = tnn.BatchNorm2d(c_out)

        def forward(self, x):
            y = self.bn2(self.conv2(fn(self.bn1(self.conv1(x)))))
            return fn(y + (x if self.down is None else self.down_bn(self.down(x))))

    class TorchResNet18(tnn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = (tnn.Conv2d(3, 64, 7, 2, 3, bias=False) if stem == "imagenet"
                          else tnn.Conv2d(3, 64, 3, 1, 1, bias=False))
            self.bn1 = tnn.BatchNorm2d(64)
            blocks, c = [], 64
            for i, w in enumerate(WIDTHS):
                blocks += [TorchBlock(c, w, 1 if i == 0 else 2), TorchBlock(w, w, 1)]
                c = w
            self.blocks = tnn.Sequential(*blocks)
            self.fc = tnn.Linear(512, 10)

        def forward(self, x):
            x = fn(self.bn1(self.conv1(x)))
            if stem == "imagenet":
                x = tnn.functional.avg_pool2d(x, 3, 2, 1)
            return self.fc(self.blocks(x).mean((2, 3)))

    return TorchResNet18()


def randomize_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Norms with statistics and affines of their own (a fresh BatchNorm is the identity),
    so that every layer's gradient differs from every other's; in eval mode."""
    rng = np.random.default_rng(seed)
    state = model.state_dict()
    for path, a in state.items():
        if "bn" in path.split(".")[-2]:
            lo, hi = (0.5, 1.5) if path.endswith(("gamma", "running_var")) else (-0.2, 0.2)
            state[path] = rng.uniform(lo, hi, np.shape(a)).astype(np.float32)
    model.load_state_dict(state)
    return model.eval()
