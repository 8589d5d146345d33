"""Convolutions shaped to cross every edge of the matrix kernels' tiling (ragged rows and columns, panels that
straddle two images, groups, 1x1 panels packed as vectors, weights as constants and as inputs) with the
fused bias + residual + activation epilogue, against onnxruntime."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from tests.conftest import make_model, rel_l2

R = np.random.default_rng(1)

SHAPES = [  # (batch, Cin, H, W, Cout, kernel, stride, pad, group)
    (1, 64, 56, 56, 64, 1, 1, 0, 1),     # 1x1 on one image: 3136 columns = 196 panels of 16, each a vector copy
    (1, 32, 7, 7, 70, 1, 1, 0, 1),       # 49 columns: a ragged last panel (packed by element); 70 rows: ragged
    (2, 16, 8, 8, 24, 1, 1, 0, 1),       # 1x1, batch 2: whole panels of the second image (its offset)
    (1, 16, 9, 11, 13, 3, 1, 1, 1),      # 99 columns, 13 rows
    (2, 8, 7, 7, 20, 3, 2, 1, 1),        # batch 2: a panel holds the end of image 0 and the start of image 1
    (3, 12, 5, 6, 18, 1, 1, 0, 3),       # 1x1 with batch 3 and 3 groups: panels across images
    (1, 12, 10, 10, 24, 3, 1, 1, 2),     # groups with 3x3
    (1, 24, 14, 14, 48, 1, 1, 0, 2),     # 1x1 with groups, 196 columns: packed
    (1, 24, 8, 8, 42, 1, 1, 0, 2),       # 1x1 with groups, 64 columns = 4 whole panels
    (1, 3, 33, 33, 16, 7, 2, 3, 1),      # a stem: KK = 147
    (1, 5, 38, 45, 12, 3, 2, 1, 1),      # stride 2, 23 columns a row: strided vector gathers, then a tail
    (1, 16, 30, 30, 20, 1, 2, 0, 1),     # 1x1 stride 2 (a downsampling shortcut): im2col, not the 1x1 panels
]


def conv_model(n, cin, h, w, cout, k, s, p, g, weights_as_input, act="Relu"):
    x = R.uniform(-1, 1, (n, cin, h, w)).astype(np.float32)
    wt = R.uniform(-1, 1, (cout, cin // g, k, k)).astype(np.float32)
    b = R.uniform(-1, 1, cout).astype(np.float32)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    r = R.uniform(-1, 1, (n, cout, oh, ow)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s],
                              pads=[p] * 4, group=g),
             helper.make_node("Add", ["c", "r"], ["a"]),
             helper.make_node(act, ["a"], ["y"])]
    feeds = {"x": x, "r": r}
    inits = {"b": b}
    if weights_as_input:
        feeds["w"] = wt
    else:
        inits["w"] = wt
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.parametrize("weights_as_input", [False, True], ids=["const-w", "input-w"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_conv_epilogue_matches_onnxruntime(ctx, shape, weights_as_input):
    import onnxruntime as ort
    model, feeds = conv_model(*shape, weights_as_input)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    net = dlnet.Net(ctx).load_onnx(model)
    if ctx.is_cpu and shape[5:8] == (1, 1, 0):  # 1x1 stride 1: packed per panel, vectors where it lies in one image
        assert "conv2d_cpu_local" in [launch.kernel.function_name for launch in net.launches]
    got = list(net.run(feeds).values())[0]
    assert got.shape == want.shape
    assert rel_l2(got, want) < 1e-5
    net.release()


@pytest.mark.parametrize("weights_as_input", [False, True], ids=["const-w", "input-w"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_conv_local_panels_match_onnxruntime(ctx, shape, weights_as_input, monkeypatch):
    """The same shapes with every packed convolution forced onto CPU devices' per-panel __local packing."""
    import onnxruntime as ort
    from dlnet.kernels import lowering
    monkeypatch.setattr(lowering, "CONV_CPU_LOCAL_MIN_BYTES", 0)
    model, feeds = conv_model(*shape, weights_as_input)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    net = dlnet.Net(ctx).load_onnx(model)
    if ctx.is_cpu and shape[5] > 1:
        assert "conv2d_cpu_local" in [launch.kernel.function_name for launch in net.launches]
    got = list(net.run(feeds).values())[0]
    assert rel_l2(got, want) < 1e-5
    net.release()


def test_conv_sigmoid_epilogue(ctx):
    import onnxruntime as ort
    model, feeds = conv_model(2, 8, 7, 7, 20, 3, 1, 1, 1, False, act="Sigmoid")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = list(dlnet.Net(ctx).load_onnx(model).run(feeds).values())[0]
    assert rel_l2(got, want) < 1e-5
