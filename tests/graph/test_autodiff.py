"""Every op with a gradient rule against float64 central differences.

Each case builds `loss = sum(op(x...) * w)` with a fixed random weighting `w`, takes dlnet's analytic gradients
(float32, on the device, through `autodiff.gradients` and the trainer's passes) and compares them with central
differences of the same function computed on the host in float64: the op's own `numpy` method where it has one,
`onnx.reference` otherwise. Inputs are drawn away from kinks (Relu/Abs at 0, Clip bounds, ties in MaxPool).
"""
import numpy as np
import pytest
from onnx import TensorProto, helper

from dlnet.graph.autodiff import gradients
from dlnet.graph.ir import Builder, Graph
from dlnet.graph.ops import OPS
from dlnet.graph.passes import run_passes
from dlnet.graph.passes.fold import fold_constants, remove_dead
from dlnet.graph.passes.fuse import fuse_pointwise
from dlnet.net import Plan

from ..conftest import context, reference, rel_l2

TOL = 1e-3

# Rules not checked here, with the reason.
SKIPPED = {
    "Dropout": "random: its mask is checked (forward and backward use the same one) in tests/graph/test_dropout.py",
    "RoundBfloat16": "straight through (dy), not rounding's derivative: checked in tests/onnx/test_dtypes.py",
}


def normal(*shape):
    return ("normal", shape)


def positive(*shape):
    """in [0.5, 2]: Log, Sqrt, Reciprocal and divisors stay away from 0"""
    return ("positive", shape)


def away(*shape):
    """|x| in [0.1, 2]: away from the kink at 0 (Relu, Abs)"""
    return ("away", shape)


def distinct(*shape):
    """a permutation of well-separated values: no ties for MaxPool"""
    return ("distinct", shape)


def sample(spec, rng):
    kind, shape = spec
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind == "positive":
        return rng.uniform(0.5, 2.0, shape)
    if kind == "away":
        return rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    if kind == "distinct":
        n = int(np.prod(shape))
        return (rng.permutation(n) * (4.0 / n) - 2.0).reshape(shape) + rng.uniform(0, 0.1 / n, shape)
    if kind == "clip":  # Clip(-0.5, 0.5): at least 0.05 from each bound
        x = rng.uniform(-1.0, 1.0, shape)
        return np.where(np.abs(np.abs(x) - 0.5) < 0.05, x * 0.5, x)
    raise ValueError(kind)


# id, op, input specs (None entries are constant int64 index arrays given as ("int", array)), attrs
CASES = [
    ("Relu", "Relu", [away(2, 3, 4)], {}),
    ("Sigmoid", "Sigmoid", [normal(2, 3, 4)], {}),
    ("Tanh", "Tanh", [normal(2, 3, 4)], {}),
    ("Exp", "Exp", [normal(2, 3, 4)], {}),
    ("Log", "Log", [positive(2, 3, 4)], {}),
    ("Sqrt", "Sqrt", [positive(2, 3, 4)], {}),
    ("Abs", "Abs", [away(2, 3, 4)], {}),
    ("Neg", "Neg", [normal(2, 3, 4)], {}),
    ("Reciprocal", "Reciprocal", [positive(2, 3, 4)], {}),
    ("Identity", "Identity", [normal(2, 3, 4)], {}),
    ("Softplus", "Softplus", [normal(2, 3, 4)], {}),
    ("Gelu", "Gelu", [normal(2, 3, 4)], {}),
    ("LayerNorm", "LayerNorm", [normal(2, 3, 6), positive(6), normal(6)], {"epsilon": 1e-5}),
    ("BatchNormTrain", "BatchNormTrain", [normal(4, 3, 2, 3), positive(3), normal(3)], {"epsilon": 1e-5}),
    ("BatchNormTrain-2d", "BatchNormTrain", [normal(5, 2), positive(2), normal(2)], {"epsilon": 1e-3}),
    ("Clip", "Clip", [("clip", (2, 3, 4))], {"min": -0.5, "max": 0.5}),
    ("Clip-min-only", "Clip", [("clip", (2, 3, 4))], {"min": -0.5}),
    ("Add", "Add", [normal(2, 3, 4), normal(2, 3, 4)], {}),
    ("Add-broadcast", "Add", [normal(2, 3, 4), normal(3, 1)], {}),
    ("Sub-broadcast", "Sub", [normal(3, 1), normal(2, 3, 4)], {}),
    ("Mul-broadcast", "Mul", [normal(2, 3, 4), normal(4)], {}),
    ("Div", "Div", [normal(2, 3, 4), positive(2, 3, 4)], {}),
    ("Div-broadcast", "Div", [normal(2, 1, 4), positive(3, 1)], {}),
    ("Cast-f64", "Cast", [normal(2, 3, 4)], {"to": "float64"}),
    ("Gemm", "Gemm", [normal(3, 4), normal(4, 5)], {}),
    ("Gemm-transA-transB-bias", "Gemm", [normal(4, 3), normal(5, 4), normal(5)],
     {"transA": 1, "transB": 1, "alpha": 0.7, "beta": 1.3}),
    ("Gemm-transB-bias-col", "Gemm", [normal(3, 4), normal(5, 4), normal(3, 1)], {"transB": 1}),
    ("MatMul-batched", "Gemm", [normal(2, 3, 4), normal(4, 5)], {}),
    ("MatMul-batched-both", "Gemm", [normal(2, 3, 4), normal(2, 4, 5)], {"transA": 0, "transB": 0}),
    ("Reduce-sum", "Reduce", [normal(2, 3, 4)], {"mode": "sum", "axes": (1,), "keepdims": 1}),
    ("Reduce-sum-all", "Reduce", [normal(2, 3, 4)], {"mode": "sum", "axes": (0, 1, 2), "keepdims": 0}),
    ("Reduce-mean", "Reduce", [normal(2, 3, 4)], {"mode": "mean", "axes": (0, 2), "keepdims": 0}),
    ("Softmax", "Softmax", [normal(3, 5)], {"axis": 1}),
    ("Softmax-axis0", "Softmax", [normal(3, 4, 2)], {"axis": 0}),
    ("LogSoftmax", "LogSoftmax", [normal(3, 5)], {"axis": 1}),
    ("LogSoftmax-last", "LogSoftmax", [normal(2, 3, 4)], {"axis": -1}),
    ("Reshape", "Reshape", [normal(2, 3, 4)], {"shape": (6, 4)}),
    ("Transpose", "Transpose", [normal(2, 3, 4)], {"perm": (2, 0, 1)}),
    ("Slice", "Slice", [normal(4, 6)], {"starts": (1, 0), "steps": (1, 2), "counts": (2, 3)}),
    ("Slice-reverse", "Slice", [normal(4, 6)], {"starts": (3, 5), "steps": (-1, -2), "counts": (3, 3)}),
    ("SliceView", "SliceView", [normal(4, 6)], {"offset": 6, "shape": (2, 2, 3)}),
    ("Expand", "Expand", [normal(3, 1)], {"shape": (2, 3, 4)}),
    ("Concat", "Concat", [normal(2, 3, 4), normal(2, 2, 4)], {"axis": 1}),
    ("Gather", "Gather", [normal(5, 3), ("int", np.array([0, 4, 4, -1, 2]))], {"axis": 0}),
    ("Gather-axis1", "Gather", [normal(2, 5, 3), ("int", np.array([[1, 1], [3, 0]]))], {"axis": 1}),
    # few indices into a large table (an embedding): gather.cl's chains of occurrences, not a scan per element
    ("Gather-embedding", "Gather", [normal(200, 6), ("int", np.array([3, 7, 3, -1, 199, 0, 7, 7, 50, -200, 3, 120]))],
     {"axis": 0}),
    ("Gather-embedding-axis1", "Gather", [normal(2, 300, 3), ("int", np.array([[5, 299], [5, -1], [0, 17], [5, 2]]))],
     {"axis": 1}),
    ("Pad", "Pad", [normal(2, 3, 4)], {"pads": (0, 1, 2, 0, 2, 1), "mode": "constant", "value": 0.5}),
    ("Conv", "Conv", [normal(2, 3, 5, 5), normal(4, 3, 3, 3)], {"strides": (1, 1), "pads": (1, 1, 1, 1)}),
    ("Conv-stride-bias", "Conv", [normal(2, 3, 6, 6), normal(4, 3, 3, 3), normal(4)],
     {"strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ("Conv-group-dilation", "Conv", [normal(1, 4, 7, 7), normal(4, 2, 3, 3), normal(4)],
     {"group": 2, "dilations": (2, 2), "pads": (2, 2, 2, 2)}),
    ("Conv-depthwise", "Conv", [normal(2, 3, 5, 5), normal(3, 1, 3, 3)], {"group": 3, "pads": (1, 1, 1, 1)}),
    ("Conv-depthwise-stride-mult-dil", "Conv", [normal(2, 3, 7, 6), normal(6, 1, 3, 3), normal(6)],
     {"group": 3, "strides": (2, 2), "pads": (1, 1, 1, 1), "dilations": (1, 2)}),
    ("Conv-depthwise-1d", "Conv", [normal(2, 4, 9), normal(4, 1, 5)], {"group": 4, "strides": (2,), "pads": (2, 2)}),
    ("Conv-1d", "Conv", [normal(2, 3, 7), normal(2, 3, 3), normal(2)], {"strides": (2,), "pads": (1, 1)}),
    ("MaxPool", "MaxPool", [distinct(2, 2, 4, 4)], {"kernel_shape": (2, 2), "strides": (2, 2)}),
    ("MaxPool-3x2-tiled", "MaxPool", [distinct(1, 3, 6, 8)], {"kernel_shape": (3, 2), "strides": (3, 2)}),
    ("MaxPool-ragged", "MaxPool", [distinct(2, 2, 5, 5)], {"kernel_shape": (2, 2), "strides": (2, 2)}),
    ("MaxPool-overlap-pad", "MaxPool", [distinct(1, 2, 5, 5)],
     {"kernel_shape": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1)}),
    ("MaxPool-3x3-s2-pad", "MaxPool", [distinct(2, 3, 9, 8)],
     {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)}),
    ("MaxPool-dilated-ceil", "MaxPool", [distinct(1, 2, 9, 10)],
     {"kernel_shape": (3, 2), "strides": (2, 3), "pads": (1, 0, 1, 1), "dilations": (2, 1), "ceil_mode": 1}),
    ("AveragePool", "AveragePool", [normal(2, 2, 4, 4)], {"kernel_shape": (2, 2), "strides": (2, 2)}),
    ("AveragePool-pad-excl", "AveragePool", [normal(1, 2, 5, 5)],
     {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "count_include_pad": 0}),
    ("AveragePool-pad-incl", "AveragePool", [normal(1, 2, 5, 5)],
     {"kernel_shape": (3, 3), "strides": (1, 1), "pads": (1, 1, 1, 1), "count_include_pad": 1}),
]

# ops without a `numpy` method: onnx.reference computes their float64 forward
ONNX_REFERENCE = ("Conv", "MaxPool", "AveragePool")


# that every rule has a case here or in test_gradients_all.py: test_gradients_all.test_every_rule_has_a_case


def make_inputs(specs, seed):
    rng = np.random.default_rng(seed)
    return [spec[1].astype(np.int64) if spec[0] == "int" else sample(spec, rng) for spec in specs]


def host_forward(op, attrs, arrays):
    """op(*arrays) in float64 on the host."""
    if op in ONNX_REFERENCE:
        names = [f"x{i}" for i in range(len(arrays))]
        onnx_attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.items()}
        node = helper.make_node(op, names, ["y"], **onnx_attrs)
        graph = helper.make_graph([node], "fd", [helper.make_tensor_value_info(n, TensorProto.DOUBLE, a.shape)
                                                 for n, a in zip(names, arrays)],
                                  [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
        return np.asarray(reference(model, dict(zip(names, arrays)))[0], np.float64)
    g = Graph()
    y = Builder(g).op(op, [g.constant(a) for a in arrays], dict(attrs))
    assert y.const is not None, f"{op}: no numpy folding on the host"
    return np.asarray(y.const, np.float64)


def central_differences(op, attrs, arrays, w, wrt, eps=1e-6):
    """d sum(op(x) * w) / d x[wrt], float64."""
    x = arrays[wrt]
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        keep = x[i]
        x[i] = keep + eps
        up = float((host_forward(op, attrs, arrays) * w).sum())
        x[i] = keep - eps
        down = float((host_forward(op, attrs, arrays) * w).sum())
        x[i] = keep
        grad[i] = (up - down) / (2 * eps)
    return grad


def device_gradients(op, attrs, arrays, w, fed_weights=False, constant=(), ctx=None):
    """(loss, [d loss / d x for each float input]) from dlnet: float32 on ctx's device (else the tests'). fed_weights:
    w is an input, so dy is no constant and no backward node folds on the host (each runs its kernel); constant:
    indices of float arrays given as constants (no gradient asked)."""
    g = Graph("autodiff")
    b = Builder(g)
    inputs, feeds = [], []
    for i, a in enumerate(arrays):
        if a.dtype.kind == "f" and i not in constant:
            v = g.add_input(f"x{i}", "float32", a.shape)
            feeds.append(a.astype(np.float32))
            inputs.append(v)
        else:
            inputs.append(g.constant(a))
    xs = [v for v in inputs if v.const is None]
    y = b.op(op, inputs, dict(attrs))
    if fed_weights:
        weights = g.add_input("w", y.dtype, w.shape)
        feeds.append(w.astype(y.dtype))
    else:
        weights = b.const(w.astype(y.dtype))
    prod = b.op("Mul", [y, weights])
    loss = b.op("Reduce", [prod], {"mode": "sum", "axes": tuple(range(prod.rank)), "keepdims": 0})
    grads = gradients(g, loss, xs)
    assert all(gv is not None for gv in grads)
    g.outputs = [loss] + grads
    g.output_names = ["loss"] + [f"grad:{v.name}" for v in xs]
    run_passes(g, [fold_constants, fuse_pointwise, remove_dead])  # what the trainer runs
    g.verify()
    plan = Plan(ctx or context(), g)
    try:
        outs = plan.run(feeds)
    finally:
        plan.release()
    return float(outs[0]), outs[1:]


def check_case(op, specs, attrs, seed=0):
    arrays = make_inputs(specs, seed)
    y = host_forward(op, attrs, arrays)
    w = np.random.default_rng(seed + 100).standard_normal(y.shape)
    loss, grads = device_gradients(op, attrs, arrays, w)
    ref_loss = float((y * w).sum())
    assert abs(loss - ref_loss) <= 1e-4 * max(1.0, abs(ref_loss)), (loss, ref_loss)
    errors = []
    float_inputs = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]
    for i, g in zip(float_inputs, grads):
        fd = central_differences(op, attrs, arrays, w, i)
        assert g.shape == fd.shape, (i, g.shape, fd.shape)
        errors.append(rel_l2(g, fd))
    return errors


@pytest.mark.parametrize("case_id,op,specs,attrs", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_central_differences(case_id, op, specs, attrs):
    errors = check_case(op, specs, attrs)
    assert max(errors) <= TOL, f"{case_id}: relative L2 error per input {errors}"


def test_a_wrong_rule_is_caught(monkeypatch):
    """The checker itself: a Tanh rule with the wrong sign of y^2 must fail it."""
    def wrong(self, b, node, dys):
        y = node.outputs[0]
        return [b.op("Mul", [dys[0], b.op("Add", [b.const(np.ones((), y.dtype)), b.op("Mul", [y, y])])])]

    monkeypatch.setattr(type(OPS["Tanh"]), "grad", wrong)
    errors = check_case("Tanh", [normal(2, 3, 4)], {})
    assert max(errors) > 10 * TOL, errors


def test_embedding_gradient_follows_chains_of_occurrences():
    """GatherGrad of 4096 token ids into a 5000 x 8 table (repeats, negative ids) runs gather.cl's links, zero and sum
    kernels, and gives each row the sum of its ids' rows of dy in increasing order (float32, as numpy adds them)."""
    rng = np.random.default_rng(5)
    ids = rng.integers(-5000, 5000, 4096)
    ids[:64] = 17  # (a long chain)
    dy = rng.standard_normal((4096, 8)).astype(np.float32)
    g = Graph("embedding")
    b = Builder(g)
    dyv = g.add_input("dy", "float32", dy.shape)
    dx = b.op("GatherGrad", [dyv, g.constant(ids)], {"axis": 0, "in_shape": (5000, 8)})
    g.outputs, g.output_names = [dx], ["dx"]
    plan = Plan(context(), g)
    try:
        assert any("GatherGrad links" in launch.label for launch in plan.launches)
        got = plan.run([dy])[0]
    finally:
        plan.release()
    want = np.zeros((5000, 8), np.float32)
    for j, k in enumerate(ids % 5000):
        want[k] += dy[j]
    assert rel_l2(got, want) < 1e-6
