"""Transformer graphs exported from plain PyTorch at op-set 13, against onnxruntime.

At op-set 13 the exporter decomposes LayerNorm (ReduceMean, Sub, Pow, Add, Sqrt, Div, Mul, Add) and exact GELU
(Div, Erf, Add, Mul, Mul); the normalize pass recognises both and each runs as one kernel.
nn.MultiheadAttention is not here: at op-set 13 its scaled_dot_product_attention does not export (needs 14).
"""
import io
import math

import numpy as np
import onnx
import pytest

import dlnet
from tests.conftest import rel_l2

torch = pytest.importorskip("torch")
nn = torch.nn
ort = pytest.importorskip("onnxruntime")

D, HEADS, FF, VOCAB, MAX_POS = 32, 4, 64, 50, 16


class SelfAttention(nn.Module):
    """Explicit q/k/v projections and matmuls; `causal` adds a -inf mask above the diagonal."""

    def __init__(self, causal=False):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.causal = causal

    def forward(self, x):
        b, t, _ = x.shape
        split = lambda y: y.reshape(b, t, HEADS, D // HEADS).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(D // HEADS)
        if self.causal:
            # triu does not export at op-set 13: compare positions, then fill (Range, Greater, Where)
            future = torch.arange(t).unsqueeze(0) > torch.arange(t).unsqueeze(1)
            scores = scores + torch.zeros(t, t).masked_fill(future, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.o(y.transpose(1, 2).reshape(b, t, D))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)) with exact (erf) GELU."""

    def __init__(self, attention):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = attention
        self.mlp = nn.Sequential(nn.Linear(D, FF), nn.GELU(), nn.Linear(FF, D))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Encoder(nn.Module):
    """Token + position embeddings (Gather on int64 ids), two blocks, a final LayerNorm."""

    def __init__(self, causal=False, lm_head=False):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(MAX_POS, D)
        self.blocks = nn.Sequential(Block(SelfAttention(causal)), Block(SelfAttention(causal)))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB) if lm_head else None

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        y = self.ln(self.blocks(self.tok(ids) + self.pos(pos)))
        return self.head(y) if self.head is not None else y


class ViT(nn.Module):
    """Patch embedding (Conv2d stride = patch, flatten, transpose), a class token, position embedding, blocks."""

    def __init__(self, image=16, patch=4, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, D, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, D) * 0.1)
        self.pos = nn.Parameter(torch.randn(1, n + 1, D) * 0.1)
        self.blocks = nn.Sequential(Block(SelfAttention()), Block(SelfAttention()))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, classes)

    def forward(self, x):
        y = self.patch(x).flatten(2).transpose(1, 2)
        y = torch.cat([self.cls.expand(y.shape[0], -1, -1), y], dim=1) + self.pos
        return self.head(self.ln(self.blocks(y))[:, 0])


def _randomise_norms(module):
    """LayerNorm weights away from (1, 0), so a wrong gamma/beta order shows."""
    g = torch.Generator().manual_seed(2)
    for m in module.modules():
        if isinstance(m, nn.LayerNorm):
            m.weight.data.copy_(torch.rand(m.normalized_shape, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.normalized_shape, generator=g) * 0.2)
    return module


def _export(module, x, dynamic):
    buf = io.BytesIO()
    torch.onnx.export(module.eval(), (x,), buf, opset_version=13, dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": dynamic, "y": {0: "batch"}})
    return buf.getvalue()


def _tokens(shape, seed):
    return np.random.default_rng(seed).integers(0, VOCAB, shape).astype(np.int64)


def _images(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


MODELS = {
    # name: (module factory, example input maker, first shape, second shape, dynamic axes)
    "encoder": (lambda: Encoder(), _tokens, (2, 10), (3, 7), {0: "batch", 1: "seq"}),
    "causal_decoder": (lambda: Encoder(causal=True, lm_head=True), _tokens, (2, 12), (1, 5), {0: "batch", 1: "seq"}),
    "vit": (lambda: ViT(), _images, (2, 3, 16, 16), (1, 3, 16, 16), {0: "batch"}),
}


def _model(name):
    torch.manual_seed(0)
    factory, make_input, shape, shape2, dynamic = MODELS[name]
    module = _randomise_norms(factory())
    data = _export(module, torch.from_numpy(make_input(shape, 0)), dynamic)
    return data, make_input, shape, shape2


@pytest.mark.parametrize("name", list(MODELS))
def test_transformer_export_matches_onnxruntime(ctx, name):
    data, make_input, shape, shape2 = _model(name)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    net = dlnet.Net(ctx).load_onnx(onnx.load_from_string(data))
    for seed, s in ((1, shape), (2, shape2)):  # a second batch / sequence length re-plans
        feeds = {"x": make_input(s, seed)}
        got = net.run(feeds)["y"]
        want = sess.run(None, feeds)[0]
        assert got.shape == want.shape
        assert rel_l2(got, want) <= 1e-4
    assert len(net.plans) == 2
    attention = [n for n in net.graph.nodes if n.op == "Attention"]
    assert len(attention) == 2 and all(n.attrs["layout"] == ("bthd",) * 4 for n in attention)
    around = [x.producer.op for n in attention for x in n.inputs[:3] if x.producer is not None] + \
        [u.op for n in attention for u in n.outputs[0].users]
    assert "Transpose" not in around, around  # (the head splits and merges are the node's layout)
    net.release()


@pytest.mark.parametrize("name", ["encoder", "vit"])
def test_layernorm_and_gelu_run_as_one_kernel_each(ctx, name):
    data, make_input, shape, _ = _model(name)
    model = onnx.load_from_string(data)
    ops = [n.op_type for n in model.graph.node]
    assert "LayerNormalization" not in ops and "Erf" in ops and "Pow" in ops  # op-set 13: decomposed
    net = dlnet.Net(ctx).load_onnx(model)
    net.run({"x": make_input(shape, 1)})
    text = str(net.graph)
    # two per block, one final (each with the residual Add before it: test_transformer_fusions.py)
    assert text.count("= AddLayerNorm(") == 5 and "= LayerNorm(" not in text
    assert "Pow" not in text and "Sqrt" not in text and "Erf" not in text and "Reduce(" not in text
    gelus = [line for line in text.splitlines() if "Gelu" in line]
    assert len(gelus) == 2  # one per block's MLP (fused with its neighbours or alone)
    net.release()
