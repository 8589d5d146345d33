"""Small transformer-era models in plain PyTorch, exported the ways torch 2.13 users export them, against torch.

Three models: a GPT-style causal decoder (token and position embeddings, pre-norm blocks with the causal mask either
from torch.triu or from scaled_dot_product_attention(is_causal=True), GELU MLPs, an LM head), a ViT-style encoder
(patch convolution, class token, LayerNorm, attention, GELU MLP) and a ConvNeXt-style block stack (7x7 depthwise
convolution, LayerNorm channels-last, tanh GELU, layer scale, residual). Each is exported three ways:
- "dynamo": torch 2.13's default exporter (torch.onnx.export(..., dynamo=True), op-set 20: LayerNormalization, Gelu
  and Trilu nodes, weights in a `.onnx.data` file beside the model, loaded from the model's path);
- "ts14" / "ts17": the TorchScript exporter (dynamo=False) at op-sets 14 and 17 (14 decomposes LayerNorm and GELU:
  the normalize pass makes each one node again).
dlnet matches torch within 1e-4 (relative L2) at the exported shape and at a second shape along the dynamic axes
(batch and sequence length; batch and image size for the ConvNeXt stack), each shape planned on its own.
"""
import numpy as np
import onnx
import pytest

import dlnet
from tests.conftest import rel_l2

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")  # the dynamo exporter's dependency
nn = torch.nn
F = torch.nn.functional

D, HEADS, FF, VOCAB, MAX_POS = 32, 4, 64, 40, 32


class Attention(nn.Module):
    """Multi-head self-attention from one qkv projection; `causal`: "triu" adds a -inf mask above the diagonal made
    by torch.triu, "sdpa" asks scaled_dot_product_attention for it (is_causal=True), None: no mask."""

    def __init__(self, causal=None):
        super().__init__()
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.causal = causal

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (y.reshape(b, t, HEADS, D // HEADS).transpose(1, 2) for y in self.qkv(x).split(D, dim=-1))
        if self.causal == "triu":
            mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
            att = torch.softmax(q @ k.transpose(-2, -1) / (D // HEADS) ** 0.5 + mask, dim=-1)
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal == "sdpa")
        return self.out(y.transpose(1, 2).reshape(b, t, D))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)) (exact or tanh GELU)."""

    def __init__(self, causal=None, gelu="none"):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = Attention(causal)
        self.mlp = nn.Sequential(nn.Linear(D, FF), nn.GELU(approximate=gelu), nn.Linear(FF, D))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    """GPT-style: token + position embeddings, a triu-masked block and an is_causal SDPA block (tanh GELU), a
    final LayerNorm, an LM head."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(MAX_POS, D)
        self.blocks = nn.Sequential(Block("triu"), Block("sdpa", gelu="tanh"))
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        return self.head(self.ln(self.blocks(self.tok(ids) + self.pos(pos))))


class ViT(nn.Module):
    """Patch convolution (stride = patch), flatten, class token, position embedding, two blocks, LayerNorm, head."""

    def __init__(self, image=16, patch=4, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, D, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, D) * 0.1)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, D) * 0.1)
        self.blocks = nn.Sequential(Block(), Block())
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, classes)

    def forward(self, x):
        y = self.patch(x).flatten(2).transpose(1, 2)
        y = torch.cat([self.cls.expand(y.shape[0], -1, -1), y], dim=1) + self.pos
        return self.head(self.ln(self.blocks(y))[:, 0])


class ConvNeXtBlock(nn.Module):
    """x + gamma * pw2(gelu(pw1(ln(dwconv7x7(x))))) with the LayerNorm and pointwise layers channels-last."""

    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.ln = nn.LayerNorm(c, eps=1e-6)
        self.pw1, self.pw2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.act = nn.GELU(approximate="tanh")
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(self.act(self.pw1(self.ln(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """A 4x4 stride-4 stem with a channels-first LayerNorm (permute, LayerNorm, permute), two blocks, a pooled head."""

    def __init__(self, c=16, classes=10):
        super().__init__()
        self.stem, self.ln = nn.Conv2d(3, c, 4, stride=4), nn.LayerNorm(c, eps=1e-6)
        self.blocks = nn.Sequential(ConvNeXtBlock(c), ConvNeXtBlock(c))
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        y = self.ln(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.head(self.blocks(y).mean(dim=(2, 3)))


def _tokens(shape, seed):
    return np.random.default_rng(seed).integers(0, VOCAB, shape).astype(np.int64)


def _images(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


MODELS = {  # name: (factory, input maker, export shape, second shape, dynamic axes {axis: name})
    "decoder": (Decoder, _tokens, (2, 12), (3, 7), {0: "batch", 1: "seq"}),
    "vit": (ViT, _images, (2, 3, 16, 16), (3, 3, 16, 16), {0: "batch"}),
    "convnext": (ConvNeXt, _images, (2, 3, 32, 32), (1, 3, 24, 40), {0: "batch", 2: "height", 3: "width"}),
}
EXPORTS = {"dynamo": (True, None), "ts14": (False, 14), "ts17": (False, 17)}


def _randomise_norms(module):
    """LayerNorm weights away from (1, 0), so a wrong scale/bias order or a missing one shows."""
    g = torch.Generator().manual_seed(2)
    for m in module.modules():
        if isinstance(m, nn.LayerNorm):
            m.weight.data.copy_(torch.rand(m.normalized_shape, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.normalized_shape, generator=g) * 0.2)
    return module


def export(module, x, path, how, dynamic):
    dynamo, opset = EXPORTS[how]
    kw = {"input_names": ["x"], "output_names": ["y"], "dynamo": dynamo}
    if dynamo:  # torch 2.13's default: op-set 20, the weights in path + ".data"
        kw["dynamic_shapes"] = ({axis: torch.export.Dim(name, min=1, max=64) for axis, name in dynamic.items()},)
    else:
        kw.update(opset_version=opset, dynamic_axes={"x": dynamic, "y": {0: "batch"}})
    torch.onnx.export(module, (x,), str(path), **kw)
    return str(path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{(model, how): (module, path)}, each exported once for the module's tests."""
    cache = {}

    def get(name, how):
        if (name, how) not in cache:
            torch.manual_seed(0)
            factory, make_input, shape, _, dynamic = MODELS[name]
            module = _randomise_norms(factory()).eval()
            path = tmp_path_factory.mktemp(f"{name}_{how}") / "model.onnx"
            export(module, torch.from_numpy(make_input(shape, 0)), path, how, dynamic)
            cache[name, how] = module, str(path)
        return cache[name, how]
    return get


def _ops(net):
    """Op names of the net's graph after passes, members of fused chains and epilogues (act=(Gelu, ...)) included."""
    lines = [line for line in str(net.graph).splitlines() if " = " in line]
    return [line.split("= ", 1)[1].split("(")[0] for line in lines] + \
        [line.split("act=(", 1)[1].split(",")[0] for line in lines if "act=(" in line]


@pytest.mark.slow
@pytest.mark.parametrize("how", list(EXPORTS))
@pytest.mark.parametrize("name", list(MODELS))
def test_export_matches_torch(ctx, exported, name, how):
    module, path = exported(name, how)
    _, make_input, shape, shape2, _ = MODELS[name]
    net = dlnet.Net(ctx).load_onnx(path)  # (the dynamo export's weights: read from model.onnx.data beside it)
    for seed, s in ((1, shape), (2, shape2)):
        x = make_input(s, seed)
        with torch.no_grad():
            want = module(torch.from_numpy(x)).numpy()
        got = net.run({"x": x})["y"]
        assert got.shape == want.shape
        assert rel_l2(got, want) <= 1e-4, (s, rel_l2(got, want))
    assert len(net.plans) == 2
    net.release()


@pytest.mark.slow
@pytest.mark.parametrize("how", list(EXPORTS))
def test_export_runs_layernorm_and_gelu_as_one_node_each(ctx, exported, how):
    """Whatever the export wrote (LayerNormalization and Gelu nodes, or their decompositions at op-set 14), the
    decoder's graph has one LayerNorm node per nn.LayerNorm and one GELU node per nn.GELU, none of their parts."""
    module, path = exported("decoder", how)
    written = {n.op_type for n in onnx.load(path, load_external_data=False).graph.node}
    if how == "ts14":
        assert {"ReduceMean", "Pow", "Erf", "Tanh"} <= written and "LayerNormalization" not in written
    else:
        assert "LayerNormalization" in written and ("Gelu" in written) == (how == "dynamo")
    net = dlnet.Net(ctx).load_onnx(path)
    net.run({"x": _tokens((2, 12), 1)})
    ops = _ops(net)
    assert ops.count("LayerNorm") + ops.count("AddLayerNorm") == 5  # two per block, one final (with its Add or not)
    assert ops.count("Gelu") == 1 and ops.count("GeluTanh") == 1  # the first block's exact, the second's tanh
    assert not {"Pow", "Sqrt", "Erf", "Tanh", "Reduce", "Trilu"} & set(ops)
    net.release()


@pytest.mark.slow
def test_dynamo_export_keeps_its_weights_beside_the_model(ctx, exported):
    """torch 2.13's default export writes the weights to model.onnx.data; loaded from the path they are found, and
    without that file the load fails naming the model."""
    module, path = exported("vit", "dynamo")
    model = onnx.load(path, load_external_data=False)
    external = [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external and (path + ".data").endswith("model.onnx.data")
    import os
    import shutil
    moved = path + ".moved"
    shutil.move(path + ".data", moved)
    try:
        with pytest.raises(dlnet.ModelError, match="model.onnx"):
            dlnet.Net(ctx).load_onnx(path)
    finally:
        shutil.move(moved, path + ".data")
    assert os.path.exists(path + ".data")
