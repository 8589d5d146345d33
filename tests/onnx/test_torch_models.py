"""Three more of issue 27's models in plain PyTorch, exported the three ways test_torch_exports.py exports, against
torch: a BERT-style encoder with a padding-mask input, a MobileNetV3-style net and a UNet-style net.

- BERT: word, position and token-type embeddings, post-norm blocks (one attention of explicit matmuls, one through
  scaled_dot_product_attention with a float mask), exact GELU, a tanh pooler and a classifier. The attention mask
  [B, T] of 0 / 1 is a run-time input that the model turns into an additive mask as BERT does:
  (1 - mask) * finfo(float32).min, broadcast over heads and query positions.
- MobileNetV3: hardswish stem, inverted residuals (1x1 expand, 3x3 / 5x5 depthwise, squeeze-excite with
  hardsigmoid, 1x1 project, BatchNorm after each convolution), a hardswish head.
- UNet: two levels of (3x3 conv, GroupNorm, SiLU) x 2, max-pool down; up once through ConvTranspose2d (2, stride 2)
  and once through F.interpolate(scale_factor=2, mode="bilinear", align_corners=False), each concatenated with its
  skip.

Each is exported by torch 2.13's default exporter ("dynamo": op-set 20, weights in model.onnx.data beside the model)
and by TorchScript at op-sets 14 and 17. dlnet matches torch within 1e-4 (relative L2) at the exported shape and at a
second shape along the dynamic axes (batch, and the sequence length for BERT, the image size for MobileNetV3 and
UNet), and one SGD step through dlnet.Trainer gives torch's loss and torch's drop in loss (BatchNorm on the batch's
statistics, in both).
"""
import copy

import numpy as np
import onnx
import pytest

import dlnet
from tests.conftest import rel_l2

from . import test_torch_exports as first_models
from .test_torch_exports import EXPORTS

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")  # the dynamo exporter's dependency
nn = torch.nn
F = torch.nn.functional

D, HEADS, FF, VOCAB, MAX_POS, CLASSES = 32, 4, 64, 40, 32, 5


# ---------------------------------------------------------------- BERT ---------------------------------------------
class BertAttention(nn.Module):
    """Self-attention with an additive mask [B, 1, 1, T]: explicit matmuls, or SDPA given the mask as attn_mask."""

    def __init__(self, sdpa):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.sdpa = sdpa

    def forward(self, x, mask):
        b, t, _ = x.shape
        q, k, v = (y.reshape(b, t, HEADS, D // HEADS).transpose(1, 2) for y in (self.q(x), self.k(x), self.v(x)))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y = torch.softmax(q @ k.transpose(-2, -1) / (D // HEADS) ** 0.5 + mask, dim=-1) @ v
        return self.o(y.transpose(1, 2).reshape(b, t, D))


class BertLayer(nn.Module):
    """Post-norm: x = ln1(x + attn(x)); x = ln2(x + mlp(x)) with exact GELU."""

    def __init__(self, sdpa):
        super().__init__()
        self.attn = BertAttention(sdpa)
        self.ln1, self.ln2 = nn.LayerNorm(D, eps=1e-12), nn.LayerNorm(D, eps=1e-12)
        self.mlp = nn.Sequential(nn.Linear(D, FF), nn.GELU(), nn.Linear(FF, D))

    def forward(self, x, mask):
        x = self.ln1(x + self.attn(x, mask))
        return self.ln2(x + self.mlp(x))


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.word, self.pos, self.token_type = nn.Embedding(VOCAB, D), nn.Embedding(MAX_POS, D), nn.Embedding(2, D)
        self.ln = nn.LayerNorm(D, eps=1e-12)
        self.layers = nn.ModuleList([BertLayer(sdpa=False), BertLayer(sdpa=True)])
        self.pooler, self.classifier = nn.Linear(D, D), nn.Linear(D, CLASSES)

    def forward(self, ids, mask):
        t = ids.shape[1]
        pos = torch.arange(t).unsqueeze(0)
        x = self.ln(self.word(ids) + self.pos(pos) + self.token_type(torch.zeros_like(ids)))
        additive = (1.0 - mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
        for layer in self.layers:
            x = layer(x, additive)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


def _bert_inputs(shape, seed):
    """ids, and a mask of 1s followed by 0s (padding) whose lengths differ per row; at least one token each."""
    rng = np.random.default_rng(seed)
    b, t = shape
    lengths = rng.integers(1, t + 1, b)
    lengths[0] = t  # one row unpadded
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int64)
    return {"ids": rng.integers(0, VOCAB, shape).astype(np.int64), "mask": mask}


# ---------------------------------------------------------------- MobileNetV3 --------------------------------------
def conv_bn(cin, cout, k, stride=1, groups=1, act=None):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act) if act is not None else nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, c, squeezed):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, squeezed, 1), nn.Conv2d(squeezed, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))


class InvertedResidual(nn.Module):
    def __init__(self, cin, expand, cout, k, stride, se, act):
        super().__init__()
        self.expand = conv_bn(cin, expand, 1, act=act()) if expand != cin else nn.Identity()
        self.dw = conv_bn(expand, expand, k, stride, groups=expand, act=act())
        self.se = SqueezeExcite(expand, max(8, expand // 4)) if se else nn.Identity()
        self.project = conv_bn(expand, cout, 1)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y


class MobileNetV3(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 16, 3, 2, act=nn.Hardswish())
        self.blocks = nn.Sequential(
            InvertedResidual(16, 16, 16, 3, 2, True, nn.ReLU),  # (the first block of mobilenet_v3_small)
            InvertedResidual(16, 48, 24, 3, 1, False, nn.ReLU),
            InvertedResidual(24, 72, 24, 5, 1, True, nn.Hardswish),
            InvertedResidual(24, 96, 32, 5, 2, True, nn.Hardswish))
        self.last = conv_bn(32, 96, 1, act=nn.Hardswish())
        self.head = nn.Sequential(nn.Linear(96, 64), nn.Hardswish(), nn.Linear(64, CLASSES))

    def forward(self, x):
        return self.head(self.last(self.blocks(self.stem(x))).mean((2, 3)))


# ---------------------------------------------------------------- UNet ---------------------------------------------
def double_conv(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(4, cout), nn.SiLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(4, cout), nn.SiLU())


class UNet(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.enc1, self.enc2, self.mid = double_conv(3, c), double_conv(c, 2 * c), double_conv(2 * c, 4 * c)
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.dec2 = double_conv(4 * c, 2 * c)
        self.reduce1 = nn.Conv2d(2 * c, c, 1)
        self.dec1 = double_conv(2 * c, c)
        self.out = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        s1 = self.enc1(x)
        s2 = self.enc2(F.max_pool2d(s1, 2))
        y = self.mid(F.max_pool2d(s2, 2))
        y = self.dec2(torch.cat([self.up2(y), s2], dim=1))
        y = F.interpolate(self.reduce1(y), scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.out(self.dec1(torch.cat([y, s1], dim=1)))


def _images(shape, seed):
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def _randomise_norms(module):
    """test_torch_exports' LayerNorm weights away from (1, 0), and the same for GroupNorm and BatchNorm, with
    BatchNorm's running statistics away from (0, 1), so a wrong order or a missing one shows."""
    first_models._randomise_norms(module)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.GroupNorm, nn.BatchNorm2d)):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return module


BATCH = {0: "batch"}
IMAGE = {0: "batch", 2: "height", 3: "width"}
MODELS = {  # name: (factory, input maker, export shape, second shape, dynamic axes per input, loss)
    "bert": (Bert, _bert_inputs, (2, 12), (3, 7), {"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}},
             "cross_entropy"),
    "mobilenetv3": (MobileNetV3, _images, (2, 3, 32, 32), (3, 3, 48, 40), {"x": IMAGE}, "cross_entropy"),
    "unet": (UNet, _images, (2, 3, 16, 16), (1, 3, 24, 32), {"x": IMAGE}, "mse"),
}

# test_torch_exports.py's models, for the SGD step its tests do not take (the decoder's logits as [B * T, VOCAB] rows:
# the cross-entropy of every position)
SGD_MODELS = dict(MODELS, **{
    "decoder": (lambda: nn.Sequential(first_models.Decoder(), nn.Flatten(0, 1)),
                lambda shape, seed: {"x": first_models._tokens(shape, seed)}, (2, 12), None, {"x": BATCH},
                "cross_entropy"),
    "vit": (first_models.ViT, _images, (2, 3, 16, 16), None, {"x": BATCH}, "cross_entropy"),
    "convnext": (first_models.ConvNeXt, _images, (2, 3, 32, 32), None, {"x": BATCH}, "cross_entropy"),
})


def _dims(dynamic):
    """torch.export Dims for the dynamo exporter: one Dim per axis name, shared across inputs; image sizes as
    multiples of 8 (UNet's two poolings and MobileNetV3's strides halve them three times)."""
    dims = {}
    for axes in dynamic.values():
        for name in axes.values():
            if name not in dims:
                dims[name] = 8 * torch.export.Dim(f"{name}8", min=1, max=8) if name in ("height", "width") else \
                    torch.export.Dim(name, min=1, max=64)
    return tuple({axis: dims[name] for axis, name in axes.items()} for axes in dynamic.values())


def export(module, feeds, path, how, dynamic, train=False):
    """module(*feeds) written to `path` the way `how` names (test_torch_exports.EXPORTS). train: every weight keeps its
    module's qualified name (no optimisations, no constant folding), as dlnet.torch does for training."""
    dynamo, opset = EXPORTS[how]
    args = tuple(torch.from_numpy(a) for a in feeds.values())
    kw = {"input_names": list(feeds), "output_names": ["y"], "dynamo": dynamo}
    if dynamo:  # torch 2.13's default: op-set 20, the weights in path + ".data"
        kw.update(dynamic_shapes=_dims(dynamic), optimize=not train)
    else:
        kw.update(opset_version=opset, dynamic_axes=dict(dynamic, y=BATCH), do_constant_folding=not train)
    torch.onnx.export(module, args, str(path), verbose=False, **kw)
    return str(path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """get(model, how, train) -> (module, path), each exported once for the module's tests."""
    cache = {}

    def get(name, how, train=False):
        if (name, how, train) not in cache:
            torch.manual_seed(0)
            factory, make_input, shape, _, dynamic, _ = SGD_MODELS[name]
            module = _randomise_norms(factory()).eval()
            path = tmp_path_factory.mktemp(f"{name}_{how}_{'train' if train else 'infer'}") / "model.onnx"
            export(module, make_input(shape, 0), path, how, dynamic, train)
            cache[name, how, train] = module, str(path)
        return cache[name, how, train]
    return get


def _torch_out(module, feeds):
    with torch.no_grad():
        return module(*(torch.from_numpy(a) for a in feeds.values())).numpy()


def cases(models, slow=()):
    """(model, how) parameters: the op-set 17 TorchScript export of each model is the fast case (about a second to
    export; the default exporter takes ten and more), unless named in `slow`; the rest are marked slow."""
    return [pytest.param(name, how, marks=[] if how == "ts17" and name not in slow else [pytest.mark.slow])
            for name in models for how in EXPORTS]


@pytest.mark.parametrize("name,how", cases(MODELS, slow=("mobilenetv3",)))
def test_export_matches_torch(ctx, exported, name, how):
    module, path = exported(name, how)
    _, make_input, shape, shape2, _, _ = MODELS[name]
    net = dlnet.Net(ctx).load_onnx(path)
    for seed, s in ((1, shape), (2, shape2)):  # the second shape along every dynamic axis, planned on its own
        feeds = make_input(s, seed)
        want = _torch_out(module, feeds)
        got = net.run(feeds)["y"]
        assert got.shape == want.shape
        assert rel_l2(got, want) <= 1e-4, (s, rel_l2(got, want))
    assert len(net.plans) == 2
    net.release()


@pytest.mark.slow
def test_unfolded_batchnorm_runs_on_running_statistics(ctx, exported):
    """The exporters fold MobileNetV3's BatchNorms into its convolutions unless told not to; unfolded (the export
    the SGD test trains) they are BatchNormalization nodes, which dlnet folds on its own, on the running statistics."""
    module, path = exported("mobilenetv3", "dynamo", train=True)
    assert "BatchNormalization" in {n.op_type for n in onnx.load(path, load_external_data=False).graph.node}
    net = dlnet.Net(ctx).load_onnx(path)
    feeds = _images((3, 3, 40, 48), 6)
    assert rel_l2(net.run(feeds)["y"], _torch_out(module, feeds)) <= 1e-4
    assert "BatchNorm" not in str(net.graph)
    net.release()


def test_bert_padding_changes_the_output_as_torchs_does(ctx, exported):
    """The mask is read at run time: the same ids with more padding give other logits, torch's."""
    module, path = exported("bert", "ts17")
    net = dlnet.Net(ctx).load_onnx(path)
    feeds = _bert_inputs((2, 12), 4)
    padded = dict(feeds, mask=feeds["mask"].copy())
    padded["mask"][:, 6:] = 0
    a, b = net.run(feeds)["y"], net.run(padded)["y"]
    assert rel_l2(a, b) > 1e-2
    assert rel_l2(b, _torch_out(module, padded)) <= 1e-4
    net.release()


def torch_sgd_step(module, feeds, target, loss, lr):
    """(loss, drop in loss) of one torch.optim.SGD step on a copy of `module` in training mode (BatchNorm on the
    batch's statistics)."""
    ref = copy.deepcopy(module).train()
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    args = [torch.from_numpy(a) for a in feeds.values()]
    loss_fn = F.cross_entropy if loss == "cross_entropy" else F.mse_loss
    before = loss_fn(ref(*args), torch.from_numpy(target))
    before.backward()
    opt.step()
    with torch.no_grad():
        after = loss_fn(ref(*args), torch.from_numpy(target)).item()
    return before.item(), before.item() - after


@pytest.mark.parametrize("name,how", cases(SGD_MODELS, slow=("unet", "mobilenetv3", "convnext")))
def test_sgd_step_matches_torch(ctx, exported, name, how):
    """One SGD step through dlnet.Trainer (the module's parameters named, not the exporter's constants nor
    BatchNorm's statistics): torch's loss, and torch's drop in loss."""
    module, path = exported(name, how, train=True)
    _, make_input, shape, _, _, loss_kind = SGD_MODELS[name]
    feeds = make_input(shape, 3)
    with torch.no_grad():
        out_shape = module(*(torch.from_numpy(a) for a in feeds.values())).shape
    rng = np.random.default_rng(5)
    target = rng.integers(0, CLASSES, out_shape[0]) if loss_kind == "cross_entropy" else \
        rng.standard_normal(tuple(out_shape)).astype(np.float32)
    lr = 0.5 if loss_kind == "cross_entropy" else 0.2
    ref_loss, ref_drop = torch_sgd_step(module, feeds, target, loss_kind, lr)
    net = dlnet.Net(ctx).load_onnx(path)
    written = {i.name for i in onnx.load(path, load_external_data=False).graph.initializer}
    params = [n for n, _ in module.named_parameters()]
    assert set(params) <= written  # every parameter kept its qualified name
    trainer = dlnet.Trainer(net, loss=loss_kind, optimizer=dlnet.optim.SGD(lr=lr), params=params)
    got = trainer.step(dict(feeds, target=target))
    after = trainer.step(dict(feeds, target=target))  # the loss of the updated weights
    assert abs(got - ref_loss) <= 1e-4 * abs(ref_loss), (got, ref_loss)
    assert ref_drop > 0.05 * abs(ref_loss), ref_drop  # the step moves the loss well above float rounding
    assert abs((got - after) - ref_drop) <= 1e-4 * abs(ref_drop), (got - after, ref_drop)
    trainer.close()
    net.close()
