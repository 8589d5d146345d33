"""Whole models: the reference CNNs the onnx package ships, graphs exported from PyTorch, a TF-style graph."""
import io
import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import dlnet
from tests.conftest import make_model, rel_l2

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
# vgg19 (20 GFLOP) and densenet121 (546 launches) are the long ones on a 2-core CPU: full real-model runs behind the
# opt-in `models` marker, which CI runs once (`python -m pytest -m models`)
_LONG = pytest.mark.models
LIGHT_MODELS = ["bvlc_alexnet", pytest.param("densenet121", marks=_LONG), "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", pytest.param("vgg19", marks=_LONG), "zfnet512"]


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_reference_cnn_matches_shipped_output(ctx, name):
    """The input is the one the onnx backend runner generates for these models: arange(n) / n."""
    net = dlnet.Net(ctx).load_onnx(os.path.join(LIGHT, f"light_{name}.onnx"))
    info = net.inputs[0]
    n = int(np.prod(info.shape))
    x = (np.arange(n).reshape(info.shape) / n).astype(np.float32)
    got = list(net.run({info.name: x}).values())[0]
    want = numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    assert got.shape == want.shape
    assert rel_l2(got, want) <= 1e-4
    net.release()


# ------------------------------------------------------------------ PyTorch exports --------------------------------
torch = pytest.importorskip("torch") if False else None
try:
    import torch
    from torch import nn
except ImportError:  # the tests below skip
    torch = None


def _ort(model_bytes, feeds):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _export(module, x, opset):
    buf = io.BytesIO()
    torch.onnx.export(module.eval(), (x,), buf, opset_version=opset, dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return buf.getvalue()


def _randomise_bn(module):
    g = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.2)
    return module


def _resnet_block():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
            self.c2, self.b2 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
            self.down = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32))
            self.c3, self.b3 = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32)

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = torch.relu(self.b2(self.c2(y)) + x)
            return torch.relu(self.b3(self.c3(y)) + self.down(y))
    return Block(), (2, 16, 12, 12)


def _mobilenet_block():
    m = nn.Sequential(nn.Conv2d(8, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6(),
                      nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=32, bias=False), nn.BatchNorm2d(32), nn.ReLU6(),
                      nn.Conv2d(32, 16, 1, bias=False), nn.BatchNorm2d(16))
    return m, (2, 8, 14, 14)


def _inception_block():
    class Inception(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(12, 8, 1)
            self.b = nn.Sequential(nn.Conv2d(12, 6, 1), nn.ReLU(), nn.Conv2d(6, 8, 3, padding=1))
            self.c = nn.Sequential(nn.Conv2d(12, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 5, padding=2))
            self.d = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), nn.Conv2d(12, 4, 1))

        def forward(self, x):
            return torch.relu(torch.cat([self.a(x), self.b(x), self.c(x), self.d(x)], 1))
    return Inception(), (2, 12, 10, 10)


def _classifier_head():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AvgPool2d(2, ceil_mode=True), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(8, 20), nn.Tanh(), nn.Dropout(0.3), nn.Linear(20, 10), nn.Softmax(dim=1))
    return m, (3, 3, 11, 11)


BLOCKS = {"resnet_block": _resnet_block, "mobilenet_block": _mobilenet_block, "inception_block": _inception_block,
          "classifier_head": _classifier_head}


@pytest.mark.skipif(torch is None, reason="torch is not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("opset", [9, 11, 13])
@pytest.mark.parametrize("block", list(BLOCKS))
def test_pytorch_export_matches_onnxruntime(ctx, block, opset):
    torch.manual_seed(0)
    module, shape = BLOCKS[block]()
    _randomise_bn(module)
    x = torch.randn(*shape)
    data = _export(module, x, opset)
    net = dlnet.Net(ctx).load_onnx(onnx.load_from_string(data))
    feeds = {"x": np.random.default_rng(opset).standard_normal(shape).astype(np.float32)}
    got = net.run(feeds)["y"]
    want = _ort(data, feeds)[0]
    assert rel_l2(got, want) <= 1e-4
    # a second batch size re-plans once and keeps both plans
    feeds2 = {"x": np.random.default_rng(7).standard_normal((1,) + shape[1:]).astype(np.float32)}
    assert rel_l2(net.run(feeds2)["y"], _ort(data, feeds2)[0]) <= 1e-4
    assert len(net.plans) == 2
    net.release()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_resnet_block_is_fused(ctx):
    torch.manual_seed(0)
    module, shape = _resnet_block()
    net = dlnet.Net(ctx).load_onnx(onnx.load_from_string(_export(module, torch.randn(*shape), 13)), batch=2)
    text = str(net.graph)
    assert "BatchNormalization" not in text and "Relu(" not in text
    fused = [n for n in net._last.graph.nodes if n.op == "Conv" and len(n.inputs) == 4 and n.attrs.get("act")
             and n.attrs["act"][0] == "Relu"]  # bias, residual and Relu in the convolution's epilogue
    assert len(fused) == 2 and text.count("act=(Relu, ())") >= 2
    # four convs, two of them with the residual Add and Relu fused; no other work (device helpers aside:
    # im2col or padded planes on CPUs, split-K reductions on GPUs)
    main = [launch for launch in net._last.launches if not launch.label.endswith(("im2col", "pad", "reduce"))]
    assert len(main) == 4 and all(" Conv" in launch.label for launch in main)


# ------------------------------------------------------------------ a TF-style graph -------------------------------
def tf_style_model():
    rng = np.random.default_rng(3)
    w = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.3  # noqa: E731
    nodes = [
        helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2]),  # NHWC -> NCHW
        helper.make_node("Conv", ["xc", "w1", "b1"], ["c1"], kernel_shape=[3, 3], strides=[2, 2],
                         auto_pad="SAME_UPPER"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[4, 4], group=8, auto_pad="SAME_LOWER"),
        helper.make_node("Conv", ["c2", "w3"], ["c3"], kernel_shape=[3, 3], pads=[0, 1, 2, 1]),
        helper.make_node("MaxPool", ["c3"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1]),
        helper.make_node("AveragePool", ["p1"], ["p2"], kernel_shape=[3, 3], pads=[1, 0, 0, 1]),
        helper.make_node("Transpose", ["p2"], ["y"], perm=[0, 2, 3, 1]),  # back to NHWC
    ]
    inits = {"w1": w(8, 3, 3, 3), "b1": w(8), "w2": w(8, 1, 4, 4), "w3": w(6, 8, 3, 3)}
    return make_model(nodes, {"x": ("float32", [2, 16, 15, 3])}, ["y"], inits, opset=13)


def test_tf_style_padding_matches_onnxruntime(ctx):
    model = tf_style_model()
    x = np.random.default_rng(0).standard_normal((2, 16, 15, 3)).astype(np.float32)
    net = dlnet.Net(ctx).load_onnx(model)
    got = net.run({"x": x})["y"]
    want = _ort(model.SerializeToString(), {"x": x})[0]
    assert got.shape == want.shape
    assert rel_l2(got, want) <= 1e-4
    text = str(net.graph)
    assert text.count("= Pad(") == 5  # SAME_UPPER stride 2, SAME_LOWER even kernel, begin != end on 3 ops
    assert "value=-inf" in text
