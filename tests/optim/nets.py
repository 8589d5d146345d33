"""Small torch nets exported to ONNX for the training tests."""
import io

import numpy as np

torch = None


def _torch():
    global torch
    import torch as t
    torch = t
    return t


def make(kind):
    t = _torch()
    nn = t.nn
    t.manual_seed(0)

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 4, 3, padding=1)
            self.c2 = nn.Conv2d(4, 4, 3, padding=1)
            self.fc = nn.Linear(4 * 6 * 6, 5)

        def forward(self, x):
            h = t.relu(self.c1(x))
            h = t.relu(self.c2(h) + h)
            return self.fc(h.flatten(1))

    class Concat(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 2, 1)
            self.b = nn.Conv2d(3, 3, 3, padding=1)
            self.fc = nn.Linear(5 * 6 * 6, 5)

        def forward(self, x):
            return self.fc(t.cat([t.sigmoid(self.a(x)), t.tanh(self.b(x))], 1).flatten(1))

    class Split(nn.Module):  # a packed projection split in three, as attention's q, k, v (pieces of 8, 6, 8)
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(36, 22)
            self.fc = nn.Linear(3 * 8 + 3 * 6, 5)

        def forward(self, x):
            q, k, v = self.qkv(x.flatten(2)).split([8, 6, 8], dim=-1)
            return self.fc(t.cat([t.tanh(q) * v, t.sigmoid(k)], -1).flatten(1))

    class Attention(nn.Module):  # causal self-attention over 6 tokens of 18 features, 2 heads of d (9)
        def __init__(self, d=9):
            super().__init__()
            self.d = d
            self.qkv, self.fc = nn.Linear(18, 6 * d), nn.Linear(12 * d, 5)

        def forward(self, x):
            b, d = x.shape[0], self.d
            q, k, v = (y.reshape(b, 6, 2, d).transpose(1, 2) for y in self.qkv(x.reshape(b, 6, 18)).split(2 * d, -1))
            y = t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.fc(y.transpose(1, 2).reshape(b, -1))

    nets = {
        "conv": lambda: nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                                      nn.Linear(4 * 3 * 3, 5)),
        "grouped": lambda: nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 4, 3, groups=2),
                                         nn.Flatten(), nn.Linear(4 * 4 * 4, 5)),
        "depthwise": lambda: nn.Sequential(nn.Conv2d(3, 6, 3, padding=1, groups=3), nn.ReLU(),
                                           nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=6), nn.Flatten(),
                                           nn.Linear(6 * 6 * 6, 5)),
        "bn": lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5)),
        "pool": lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
                                      nn.Conv2d(4, 4, 3, padding=1), nn.AvgPool2d(3, stride=1, padding=1),
                                      nn.Flatten(), nn.Linear(4 * 3 * 3, 5)),
        "linear": lambda: nn.Sequential(nn.Flatten(), nn.Linear(108, 16), nn.Tanh(), nn.Linear(16, 5)),
        # a weight of 10368 elements spans two chunks of the update kernels (dlnet/train.py CHUNK)
        "wide": lambda: nn.Sequential(nn.Flatten(), nn.Linear(108, 96), nn.Tanh(), nn.Linear(96, 5)),
        # LayerNormalization over the last axis (an op of its own from op-set 17), its scale and bias away from 1, 0
        "layernorm": lambda: _shifted_norm(nn.Sequential(nn.Conv2d(3, 4, 1), nn.LayerNorm(6), nn.Tanh(), nn.Flatten(),
                                                         nn.Linear(4 * 6 * 6, 5))),
        # a Linear over a sequence (3-D input): exported as MatMul(x, Transpose(W)), W a parameter
        "tokens": lambda: nn.Sequential(nn.Conv2d(3, 4, 1), nn.Flatten(2), nn.Linear(36, 8), nn.Tanh(), nn.Flatten(),
                                        nn.Linear(32, 5)),
        # GELU's tanh form as op-set 13 exports it (decomposed: x, x^3, tanh, ...), over a sequence
        "gelu_tanh": lambda: nn.Sequential(nn.Flatten(2), nn.Linear(36, 16), nn.GELU(approximate="tanh"), nn.Flatten(),
                                           nn.Linear(3 * 16, 5)),
        "split": Split,
        "attention": Attention,
        "attention16": lambda: Attention(16),  # (head dims the tensor cores take: attention_grad_mma.cl)
        "residual": Residual,
        "concat": Concat,
    }
    return nets[kind]()


def _shifted_norm(model):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model


def export(model, x, opset=13):
    t = _torch()
    f = io.BytesIO()
    model.eval()
    t.onnx.export(model, (t.from_numpy(x),), f, opset_version=opset, dynamo=False, do_constant_folding=False,
                  input_names=["input"], output_names=["output"],
                  dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    model.train()
    import onnx
    return onnx.load_from_string(f.getvalue())


def data(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, 6, 6)).astype(np.float32), rng.integers(0, 5, n)
