"""torchvision's ConvNeXt, written here in plain torch (torchvision is not a dependency), exported by torch 2.13's
default exporter and by TorchScript at op-set 17, against torch, with its layout copies gone (graph/passes/
transposes.py): a block is depthwise 7x7 Conv (NCHW) -> permute(0, 2, 3, 1) -> LayerNorm -> Linear(C, 4C) -> GELU ->
Linear(4C, C) -> permute(0, 3, 1, 2) -> layer scale [C, 1, 1] -> residual Add; the stem, the downsampling layers and
the head's norm are LayerNorm2d (permute, LayerNorm, permute back). dlnet's graph has no Transpose left: each
LayerNorm reads its input through strides (LayerNormAxis), each way back to NCHW is read by the block's layer scale
and residual Add as a strided view. On the CPU device and with the GPU kernels on PoCL (matrix_core="portable")."""
import numpy as np
import onnx
import pytest

import dlnet
from tests.conftest import rel_l2

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")  # the dynamo exporter's dependency
nn = torch.nn
F = torch.nn.functional


class LayerNorm2d(nn.LayerNorm):
    """torchvision.models.convnext.LayerNorm2d."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class Permute(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return torch.permute(x, self.dims)


class CNBlock(nn.Module):
    """torchvision.models.convnext.CNBlock (stochastic depth: identity at inference)."""

    def __init__(self, dim):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim, bias=True), Permute([0, 2, 3, 1]),
            nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
            Permute([0, 3, 1, 2]))
        self.layer_scale = nn.Parameter(torch.rand(dim, 1, 1) + 0.5)

    def forward(self, x):
        return self.layer_scale * self.block(x) + x


class ConvNeXt(nn.Module):
    """torchvision.models.convnext.ConvNeXt's layers: a 4x4 stride-4 stem + LayerNorm2d, stages of CNBlocks with
    LayerNorm2d + 2x2 stride-2 Conv between them, average pool, LayerNorm2d, flatten, Linear."""

    def __init__(self, dims=(8, 16), depths=(2, 2), classes=10):
        super().__init__()
        layers = [nn.Sequential(nn.Conv2d(3, dims[0], 4, stride=4), LayerNorm2d(dims[0], eps=1e-6))]
        for i, (d, n) in enumerate(zip(dims, depths)):
            layers.append(nn.Sequential(*[CNBlock(d) for _ in range(n)]))
            if i + 1 < len(dims):
                layers.append(nn.Sequential(LayerNorm2d(d, eps=1e-6), nn.Conv2d(d, dims[i + 1], 2, stride=2)))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(LayerNorm2d(dims[-1], eps=1e-6), nn.Flatten(1), nn.Linear(dims[-1], classes))

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)))


def _model(dims=(8, 16), depths=(2, 2)):
    torch.manual_seed(0)
    module = ConvNeXt(dims, depths).eval()
    g = torch.Generator().manual_seed(1)
    for m in module.modules():  # LayerNorm weights away from (1, 0): a wrong scale or bias order shows
        if isinstance(m, nn.LayerNorm):
            m.weight.data.copy_(torch.rand(m.normalized_shape, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.normalized_shape, generator=g) * 0.2)
    return module


def _export(module, shape, path, how):
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    if how == "dynamo":  # torch 2.13's default: op-set 20, the weights in path + ".data"
        torch.onnx.export(module, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=True,
                          dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=16)},))
    else:
        torch.onnx.export(module, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=False,
                          opset_version=17, dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return str(path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache = {}

    def get(how):
        if how not in cache:
            module = _model()
            cache[how] = module, _export(module, (2, 3, 32, 32), tmp_path_factory.mktemp(f"convnext_{how}") /
                                         "model.onnx", how)
        return cache[how]
    return get


def _ops(graph):
    return [n.op for n in graph.nodes]


def _check(net, module, shapes):
    for seed, shape in enumerate(shapes, 1):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        with torch.no_grad():
            want = module(torch.from_numpy(x)).numpy()
        got = net.run({"x": x})["y"]
        assert got.shape == want.shape
        assert rel_l2(got, want) <= 1e-4, (shape, rel_l2(got, want))


def _cases():
    return [pytest.param("dynamo", False, marks=pytest.mark.slow), ("ts17", False),
            pytest.param("dynamo", True, marks=pytest.mark.slow), pytest.param("ts17", True, marks=pytest.mark.slow)]


@pytest.mark.parametrize("how, portable", _cases())
def test_convnext_matches_torch_without_transposes(ctx, exported, how, portable):
    """2 stages of 2 blocks: torch's answer within 1e-4 at batch 2 and 3, with none of the export's 14 Transposes
    (2 per block, 2 per LayerNorm2d; the head's pair, around a 1 x 1 image, are views and its LayerNorm stays one)
    left: the 7 LayerNorms read their input through strides, the 4 blocks' layer scale + residual read the second
    product's output as a strided view."""
    module, path = exported(how)
    written = [n.op_type for n in onnx.load(path, load_external_data=False).graph.node]
    assert written.count("Transpose") == 14
    ctx = ctx.with_options(matrix_core="portable") if portable else ctx
    net = dlnet.Net(ctx).load_onnx(path)
    _check(net, module, [(2, 3, 32, 32), (3, 3, 32, 32)])
    ops = _ops(net.graph)
    assert "Transpose" not in ops and ops.count("LayerNormAxis") == 6 and ops.count("LayerNorm") == 1, ops
    fused = [n for n in net.graph.nodes if n.op == "Fused" and n.attrs["nodes"][0].op == "Transpose"]
    assert len(fused) == 4
    names = [launch.kernel.function_name for launch in net.launches]
    assert names.count("layernorm_axis_rows8" if ctx.dev.is_cpu and not portable else "layernorm_axis") == 6
    net.release()


@pytest.mark.slow
def test_convnext_small_stage_shapes_run_without_transposes(ctx):
    """One block per stage at convnext_small's widths (96, 192, 384, 768) and an image of 64 (stages of 16, 8, 4 and
    2 pixels a side): 18 Transposes written (2 per block, 2 per LayerNorm2d), none run; torch's answer within
    1e-4."""
    module = _model((96, 192, 384, 768), (1, 1, 1, 1))
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        path = _export(module, (1, 3, 64, 64), f"{folder}/model.onnx", "ts17")
        written = [n.op_type for n in onnx.load(path).graph.node]
        net = dlnet.Net(ctx).load_onnx(path)
    assert written.count("Transpose") == 18
    _check(net, module, [(1, 3, 64, 64), (2, 3, 64, 64)])
    assert "Transpose" not in _ops(net.graph)
    net.release()


def test_convnext_in_fp16_keeps_its_layouts(ctx, exported):
    """precision="fp16": the strided reads take the half values the products store (the block's way back to NCHW
    reads the second product's half output), within 1e-2 of torch, still without a Transpose."""
    module, path = exported("ts17")
    net = dlnet.Net(dlnet.Context(ctx.info, precision="fp16")).load_onnx(path)
    x = np.random.default_rng(5).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    assert rel_l2(net.run({"x": x})["y"], want) <= 1e-2
    fused = [n for n in net.graph.nodes if n.op == "Fused" and n.attrs["nodes"][0].op == "Transpose"]
    assert "Transpose" not in _ops(net.graph) and len(fused) == 4
    assert all(m.attrs["nodes"][0].inputs[0].dtype == "float16" for m in fused)  # (the product's y, stored in half)
    net.release()
