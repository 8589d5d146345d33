"""Depthwise convolutions as a GPU runs them (dwconv.cl), forced onto whatever device runs the tests (a copy of the
context that takes its device for a GPU, as tests/kernels/test_reduce_split.py does): the tiled kernel for stride 1
(ConvNeXt's 7 x 7, MobileNet's 3 x 3, asymmetric pads, narrow planes, a bias and a residual epilogue), the direct
one elsewhere, against onnx.reference."""
import numpy as np
import pytest
from onnx import helper

import dlnet

from ..conftest import context, make_model, reference, rel_l2

rng = np.random.default_rng(5)


def gpu_like():
    ctx = context().with_options(input_chunks=1)
    ctx.is_cpu = False
    assert ctx.dev.kind == "gpu"
    return ctx


# (C, H, W, kernel, pads, strides, bias, residual)
CASES = {
    "convnext-7x7-56": (5, 56, 56, 7, [3, 3, 3, 3], 1, True, False),
    "convnext-7x7-14-residual": (6, 14, 14, 7, [3, 3, 3, 3], 1, True, True),
    "3x3-narrow-7x9": (3, 7, 9, 3, [1, 1, 1, 1], 1, False, False),
    "5x5-asymmetric-pads": (4, 30, 20, 5, [1, 2, 3, 0], 1, True, False),
    "3x3-stride-2-direct": (4, 17, 23, 3, [1, 1, 1, 1], 2, True, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_depthwise_as_the_gpu_runs_it(case):
    C, H, W, k, pads, s, bias, res = CASES[case]
    OH, OW = (H + pads[0] + pads[2] - k) // s + 1, (W + pads[1] + pads[3] - k) // s + 1
    inits = {"w": rng.standard_normal((C, 1, k, k)).astype(np.float32),
             "b": rng.standard_normal(C).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], group=C, pads=pads,
                              kernel_shape=[k, k], strides=[s, s])]
    nodes.append(helper.make_node("Add", ["c", "r"], ["y"]) if res else helper.make_node("Relu", ["c"], ["y"]))
    feeds = {"x": rng.standard_normal((2, C, H, W)).astype(np.float32)}
    if res:
        feeds["r"] = rng.standard_normal((2, C, OH, OW)).astype(np.float32)
    model = make_model(nodes, feeds, ["y"], inits)
    net = dlnet.Net(gpu_like()).load_onnx(model)
    got = net.run(feeds)["y"]
    assert rel_l2(got, reference(model, feeds)[0]) < 1e-5
    tile = [n.schedule["tile"] for n in net._last.graph.nodes if n.op == "Conv"][0]
    assert tile.startswith("tiled") == (s == 1), tile
