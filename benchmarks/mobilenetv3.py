"""MobileNetV3-small in PyTorch, for the inference benchmarks (torchvision's wheel does not
load against the CPU build of torch these machines install).

The layers follow the paper's Table 2 (Howard et al. 2019) with torchvision's choices:
BatchNorm eps 0.001, squeeze-and-excite to make_divisible(expanded / 4, 8) channels with
ReLU then HardSigmoid, a 576-channel 1x1 head, global average pool, then 576 -> 1024
(HardSwish) -> 1000. Random weights; BatchNorm statistics are set away from (0, 1) so that
folding them is not a no-op.
"""

from __future__ import annotations

# (kernel, expanded, out, squeeze-excite, hardswish, stride) per inverted-residual block
SMALL = [(3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2),
         (3, 88, 24, False, False, 1), (5, 96, 40, True, True, 2),
         (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
         (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1),
         (5, 288, 96, True, True, 2), (5, 576, 96, True, True, 1),
         (5, 576, 96, True, True, 1)]


def _divisible(v: float, by: int = 8) -> int:
    out = max(by, int(v + by / 2) // by * by)
    return out + by if out < 0.9 * v else out


def mobilenet_v3_small(num_classes: int = 1000):
    """The model (eval mode) as a torch.nn.Module."""
    import torch
    from torch import nn

    def conv_bn(cin, cout, k, stride=1, groups=1, act=None):
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout, eps=0.001)]
        return nn.Sequential(*layers, *([act()] if act else []))

    class SqueezeExcite(nn.Module):
        def __init__(self, c):
            super().__init__()
            s = _divisible(c / 4)
            self.fc1, self.fc2 = nn.Conv2d(c, s, 1), nn.Conv2d(s, c, 1)

        def forward(self, x):
            scale = nn.functional.adaptive_avg_pool2d(x, 1)
            scale = nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(scale))))
            return x * scale

    class Block(nn.Module):
        def __init__(self, cin, k, exp, cout, se, hs, stride):
            super().__init__()
            act = nn.Hardswish if hs else nn.ReLU
            layers = [] if exp == cin else [conv_bn(cin, exp, 1, act=act)]
            layers.append(conv_bn(exp, exp, k, stride, groups=exp, act=act))
            if se:
                layers.append(SqueezeExcite(exp))
            layers.append(conv_bn(exp, cout, 1))
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.body(x)
            return x + y if self.residual else y

    layers, cin = [conv_bn(3, 16, 3, 2, act=nn.Hardswish)], 16
    for k, exp, cout, se, hs, stride in SMALL:
        layers.append(Block(cin, k, exp, cout, se, hs, stride))
        cin = cout
    layers.append(conv_bn(cin, 576, 1, act=nn.Hardswish))
    model = nn.Sequential(
        *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(576, 1024), nn.Hardswish(),
        nn.Dropout(0.2), nn.Linear(1024, num_classes))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=gen))
                m.weight.copy_(1 + 0.1 * torch.randn(m.num_features, generator=gen))
    return model.eval()
