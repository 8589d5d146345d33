"""Long reductions as the GPU runs them (forced onto whatever device runs the tests): a work-group per output, and
where few outputs would leave the device idle, several work-groups per output whose partial results red_finish
combines (a bias gradient: 64 sums of 800k elements each)."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.kernels import lowering

from ..conftest import context, make_model, reference, rel_l2

rng = np.random.default_rng(11)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceLogSumExp",
                                "ReduceSumSquare"])
@pytest.mark.parametrize("shape,axes", [((8, 3, 64, 64), [0, 2, 3]), ((2, 40000), [1]), ((5, 7, 9000), [0, 2])])
def test_reduce_split(op, shape, axes, monkeypatch):
    ctx = context()
    monkeypatch.setitem(lowering.REDUCE_GROUP, "cpu", 256)
    x = rng.standard_normal(shape).astype(np.float32)
    if op == "ReduceSum":
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
        inits = {"axes": np.array(axes, np.int64)}
    else:
        node = helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=0)
        inits = {}
    model = make_model([node], {"x": x}, ["y"], inits)
    net = dlnet.Net(ctx).load_onnx(model)
    labels = [launch.label for launch in net.launches]
    assert any("Reduce split" in label for label in labels) and any("finish" in label for label in labels), labels
    want = reference(model, {"x": x})[0]
    got = net.run({"x": x})["y"]
    assert got.shape == want.shape
    assert rel_l2(got, want) < 1e-5
