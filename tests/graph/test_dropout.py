"""Dropout: a seeded on-device mask, the same in forward and backward; identity at inference."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dlnet
from dlnet.graph.autodiff import gradients
from dlnet.graph.ir import Builder, Graph
from dlnet.net import Plan

from ..conftest import context


def run_dropout(x, w, seed, ratio, salt=1):
    """(y, dx) of loss = sum(Dropout(x) * w) on the device."""
    g = Graph("dropout")
    xv = g.add_input("x", "float32", x.shape)
    sv = g.add_input("seed", "uint32", (1,))
    b = Builder(g)
    y = b.op("Dropout", [xv, sv], {"ratio": ratio, "salt": salt})
    loss = b.op("Reduce", [b.op("Mul", [y, b.const(w)])], {"mode": "sum", "axes": tuple(range(x.ndim)),
                                                             "keepdims": 0})
    (dx,) = gradients(g, loss, [xv])
    g.outputs, g.output_names = [y, dx], ["y", "dx"]
    g.verify()
    plan = Plan(context(), g)
    try:
        return plan.run([x, np.array([seed], np.uint32)])
    finally:
        plan.release()


N = 1 << 17


@pytest.fixture(scope="module")
def ones():
    return np.ones(N, np.float32), np.random.default_rng(0).standard_normal(N).astype(np.float32)


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.8])
def test_keep_rate_and_scale(ones, ratio):
    x, w = ones
    y, _ = run_dropout(x, w, seed=123, ratio=ratio)
    kept = y != 0
    rate = kept.mean()
    sigma = np.sqrt(ratio * (1 - ratio) / N)
    assert abs(rate - (1 - ratio)) < 5 * sigma, (rate, 1 - ratio)
    np.testing.assert_allclose(y[kept], 1 / (1 - ratio), rtol=1e-6)
    # no long runs: the first and second half keep at the same rate (a hash that ignores high index bits fails)
    assert abs(kept[:N // 2].mean() - kept[N // 2:].mean()) < 10 * sigma


def test_same_seed_same_mask_other_seed_or_salt_other_mask(ones):
    x, w = ones
    a, _ = run_dropout(x, w, seed=7, ratio=0.5)
    b, _ = run_dropout(x, w, seed=7, ratio=0.5)
    c, _ = run_dropout(x, w, seed=8, ratio=0.5)
    d, _ = run_dropout(x, w, seed=7, ratio=0.5, salt=2)
    np.testing.assert_array_equal(a, b)
    for other in (c, d):
        agree = ((a != 0) == (other != 0)).mean()
        assert 0.4 < agree < 0.6, agree  # independent masks agree on about half the elements


def test_backward_uses_the_forward_mask(ones):
    x, w = ones
    x = x * np.random.default_rng(1).uniform(0.5, 2.0, N).astype(np.float32)
    y, dx = run_dropout(x, w, seed=99, ratio=0.3)
    mask = y != 0
    np.testing.assert_allclose(y[mask], x[mask] / 0.7, rtol=1e-6)
    np.testing.assert_allclose(dx, np.where(mask, w / 0.7, 0), rtol=1e-6)


def dropout_model(ratio=0.5):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    r = numpy_helper.from_array(np.array(ratio, np.float32), "ratio")
    nodes = [helper.make_node("Dropout", ["x", "ratio"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["y"])]
    graph = helper.make_graph(nodes, "drop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w, r])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def test_inference_is_identity():
    x = np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32)
    w = numpy_helper.to_array(dropout_model().graph.initializer[0])
    y = dlnet.Net(context()).load_onnx(dropout_model()).run({"x": x})["y"]
    np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)


def trainer_masks(seed, steps=2):
    """The Dropout output of each training step (lr 0: weights stay put)."""
    net = dlnet.Net(context()).load_onnx(dropout_model())
    tr = dlnet.Trainer(net, loss="mse", optimizer=dlnet.optim.SGD(lr=0.0), seed=seed)
    x = np.ones((64, 8), np.float32)
    masks = []
    for _ in range(steps):
        tr.step({"x": x, "target": np.zeros((64, 4), np.float32)})
        h = next(n for n in tr._active.graph.nodes if n.op == "Dropout" and n.inputs[0].name == "x")
        masks.append(tr._active.download(context(), h.outputs[0]) != 0)
    return masks, tr


def test_trainer_seeds_each_step():
    a, tr = trainer_masks(seed=3)
    b, _ = trainer_masks(seed=3)
    c, _ = trainer_masks(seed=4)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert (a[0] != a[1]).any()  # a new mask every step
    assert (a[0] != c[0]).any()  # and another seed, another mask
    assert 0.35 < a[0].mean() < 0.65
    # evaluation runs the inference graph: no Dropout
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    w = tr.net.state_dict()["w"]
    np.testing.assert_allclose(tr.net.run({"x": x})["y"], x @ w, rtol=1e-5, atol=1e-5)
