"""A user model for `ember train`: conv-BatchNorm-ReLU-pool, dropout, linear head.

    ember train --model examples/small_cnn.py:SmallCnn --optimizer adam --lr 0.01 \
        --schedule cosine --epochs 10 --save runs/cnn.ckpt

`ember train` gives it the digits as [N, 1, 8, 8] images, as its first layer is a Conv2d
(`image = True` says so outright); the class is built with no arguments. BatchNorm's
running statistics are buffers the compiled step updates; the dropout mask comes from the
step counter, so a resumed run draws the same masks.
"""

from ember import nn


class SmallCnn(nn.Module):
    image = True

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.norm = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = self.pool(nn.functional.relu(self.norm(self.conv(x))))
        return self.head(self.drop(x.reshape(x.shape[0], -1)))
