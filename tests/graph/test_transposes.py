"""graph/passes/transposes.py: Transpose -> LayerNorm (-> Transpose back) as one LayerNormAxis (layernorm_axis.cl),
a Transpose read only by a pointwise chain as that chain's strided operand, and row-wise work between a Transpose
that keeps the last axis and its inverse done in the input's order; each against onnx's reference evaluator,
on the CPU device and with the GPU kernels on PoCL (matrix_core="portable": layernorm_axis.cl's work-groups of rows
by 8 work-items)."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from tests.conftest import context, make_model, reference, rel_l2


@pytest.fixture(params=["cpu", "portable"])
def dev_ctx(request):
    return context().with_options(matrix_core="portable") if request.param == "portable" else context()


def _run(model, feeds, ctx):
    net = dlnet.Net(ctx).load_onnx(model)
    got = net.run(feeds)
    ops = [n.op for n in net.graph.nodes]
    members = [[m.op for m in n.attrs["nodes"]] for n in net.graph.nodes if n.op == "Fused"]
    net.release()
    return got, ops, members


def _layernorm_model(shape, perm, back, opset=17):
    """Relu(x) -> Transpose(perm) -> LayerNormalization (last axis) [-> Transpose back], random scale and bias."""
    rng = np.random.default_rng(3)
    d = shape[perm[-1]]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=perm),
             helper.make_node("LayerNormalization", ["t", "s", "b"], ["n"], axis=-1, epsilon=1e-5)]
    if back:
        nodes.append(helper.make_node("Transpose", ["n"], ["y"], perm=[int(i) for i in np.argsort(perm)]))
    else:
        nodes.append(helper.make_node("Identity", ["n"], ["y"]))
    inits = {"s": (rng.random(d) + 0.5).astype(np.float32), "b": rng.standard_normal(d).astype(np.float32)}
    return make_model(nodes, {"x": ("float32", shape)}, ["y"], inits, opset=opset)


@pytest.mark.parametrize("shape, perm, back", [
    ((2, 13, 7, 7), (0, 2, 3, 1), True),  # LayerNorm2d: channels of NCHW, 49 rows per image (not a multiple of 32)
    ((2, 13, 7, 7), (0, 2, 3, 1), False),  # a block's start: written channels-last for the Linear after it
    ((3, 40, 5), (0, 2, 1), False),  # Swin's patch embedding: [N, C, L] -> [N, L, C] -> LayerNorm
    ((5, 3, 70), (1, 2, 0), True),  # the first axis normalised: outer 1, inner 210
])
def test_transpose_layernorm_is_one_strided_layernorm(dev_ctx, shape, perm, back):
    model = _layernorm_model(shape, perm, back)
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32) + 0.3
    (want,) = reference(model, {"x": x})
    got, ops, _ = _run(model, {"x": x}, dev_ctx)
    assert rel_l2(got["y"], want) <= 1e-5
    assert "Transpose" not in ops and ops.count("LayerNormAxis") == 1 and "LayerNorm" not in ops, ops


def test_transposes_that_do_not_move_the_normalised_axis_last_stay(ctx):
    """perm (0, 3, 1, 2) puts axis 2 last but moves axis 3 too: no LayerNormAxis; a Transpose that a second node
    reads stays (it is computed anyway)."""
    shape = (2, 5, 6, 7)
    model = _layernorm_model(shape, (0, 3, 1, 2), False)
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    (want,) = reference(model, {"x": x})
    got, ops, _ = _run(model, {"x": x}, ctx)
    assert rel_l2(got["y"], want) <= 1e-5 and "LayerNormAxis" not in ops and "Transpose" in ops


def _pointwise_model(shape, perm, other, second):
    """Sigmoid(x) -> Transpose(perm) -> Mul by `other` (a constant, broadcast) -> Add `second`: "input" (a graph input
    x2), "direct" (the sigmoid itself, read as it is) or "const" (a constant: the sigmoid is the only value that y
    could be written over)."""
    rng = np.random.default_rng(7)
    out_shape = np.broadcast_shapes(tuple(shape[p] for p in perm), np.shape(other))
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["t"], perm=perm),
             helper.make_node("Mul", ["t", "c"], ["m"]),
             helper.make_node("Add", ["m", {"input": "x2", "direct": "a", "const": "c2"}[second]], ["f"]),
             helper.make_node("Softmax", ["f"], ["y"], axis=-1)]  # (f not a graph output: it may be written over a)
    inputs, inits = {"x": ("float32", shape)}, {"c": other}
    if second == "input":
        inputs["x2"] = ("float32", out_shape)
    if second == "const":
        inits["c2"] = rng.standard_normal(out_shape).astype(np.float32)
    return make_model(nodes, inputs, ["y"], inits), out_shape


@pytest.mark.parametrize("shape, perm, other, second", [
    # H == W == C: the output has the transposed input's shape; written over it, a work-item would overwrite an
    # element another still reads (Fused.writes_over refuses that input)
    ((2, 6, 6, 6), (0, 3, 1, 2), (np.arange(6, dtype=np.float32) + 0.5).reshape(6, 1, 1), "const"),
    ((2, 6, 6, 6), (0, 3, 1, 2), (np.arange(6, dtype=np.float32) + 0.5).reshape(6, 1, 1), "input"),
    ((7, 7), (1, 0), np.float32(1.5), "direct"),  # x read as it is and transposed: two operands of one value
    ((1, 9, 3), (2, 1, 0), np.ones((3, 9, 4), np.float32), "input"),  # the transposed value broadcast along an axis
])
def test_transpose_read_by_a_pointwise_chain_is_a_strided_operand(dev_ctx, shape, perm, other, second):
    rng = np.random.default_rng(6)
    if np.ndim(other) == 3:
        other = other * rng.random(other.shape).astype(np.float32)
    model, out_shape = _pointwise_model(shape, perm, other, second)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    if second == "input":
        feeds["x2"] = rng.standard_normal(out_shape).astype(np.float32)
    (want,) = reference(model, feeds)
    got, ops, members = _run(model, feeds, dev_ctx)
    assert got["y"].shape == out_shape == want.shape
    assert rel_l2(got["y"], want) <= 1e-6
    assert "Transpose" not in ops and any(m[0] == "Transpose" for m in members), (ops, members)


def _rows_model(shape, perm, middle, out="back"):
    """Relu(x) -> Transpose(perm) -> `middle` ("linear": h = MatMul + bias, h * Tanh(h) * s, MatMul; "mixing": a
    Softmax across the first axis) -> Transpose back (out "back"; "output": the middle's result is also a graph
    output) -> Add x."""
    rng = np.random.default_rng(8)
    c = shape[-1]
    back = [int(i) for i in np.argsort(perm)]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=perm)]
    inits = {}
    if middle == "linear":
        nodes += [helper.make_node("MatMul", ["t", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
                  helper.make_node("Tanh", ["hb"], ["a"]), helper.make_node("Mul", ["a", "hb"], ["p"]),
                  helper.make_node("Mul", ["p", "s"], ["ps"]), helper.make_node("MatMul", ["ps", "w2"], ["m"])]
        inits = {"w1": rng.standard_normal((c, 12)).astype(np.float32) / 3,
                 "b1": rng.standard_normal(12).astype(np.float32), "s": rng.random((1, 12)).astype(np.float32),
                 "w2": rng.standard_normal((12, c)).astype(np.float32) / 3}
    else:
        nodes.append(helper.make_node("Softmax", ["t"], ["m"], axis=0))
    nodes += [helper.make_node("Transpose", ["m"], ["mb"], perm=back), helper.make_node("Add", ["mb", "x"], ["y"])]
    outputs = ["y"] + (["m"] if out == "output" else [])
    return make_model(nodes, {"x": ("float32", shape)}, outputs, inits)


@pytest.mark.parametrize("shape, perm, middle, out, gone", [
    ((3, 5, 8), (1, 0, 2), "linear", "back", True),  # nn.MultiheadAttention(batch_first=True)'s pair of copies
    ((2, 3, 4, 6), (2, 0, 1, 3), "linear", "back", True),  # three leading axes: the way back is not perm itself
    ((3, 5, 8), (1, 0, 2), "mixing", "back", False),  # a Softmax across rows: the copies stay
    ((3, 5, 8), (1, 0, 2), "linear", "output", False),  # a value between is the user's: it keeps its order
])
def test_row_wise_work_between_transposes_runs_in_input_order(dev_ctx, shape, perm, middle, out, gone):
    model = _rows_model(shape, perm, middle, out)
    feeds = {"x": np.random.default_rng(9).standard_normal(shape).astype(np.float32)}
    want = reference(model, feeds)
    got, ops, members = _run(model, feeds, dev_ctx)
    for name, w in zip(["y", "m"], want):
        assert rel_l2(got[name], w) <= 1e-5, name
    moved = [op for op in ops + [m for ms in members for m in ms] if op == "Transpose"]
    assert (not moved) == gone, (ops, members)


def test_rows_whose_last_axis_is_one_keep_their_transposes(ctx):
    """[4, 4, 1] -> Transpose (1, 0, 2) -> Reshape [4, 4] -> MatMul: the product's rows are the Transpose's output
    rows but its K is their second lead axis, not their elements: the copies stay, and the result is the same."""
    rng = np.random.default_rng(10)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["t", "s2"], ["t2"]), helper.make_node("MatMul", ["t2", "w"], ["m"]),
             helper.make_node("Reshape", ["m", "s3"], ["m3"]),
             helper.make_node("Transpose", ["m3"], ["mb"], perm=[1, 0, 2]), helper.make_node("Add", ["mb", "x"], ["y"])]
    inits = {"s2": np.array([4, 4], np.int64), "s3": np.array([4, 4, 1], np.int64),
             "w": rng.standard_normal((4, 4)).astype(np.float32)}
    model = make_model(nodes, {"x": ("float32", (4, 4, 1))}, ["y"], inits)
    feeds = {"x": rng.standard_normal((4, 4, 1)).astype(np.float32)}
    (want,) = reference(model, feeds)
    got, ops, members = _run(model, feeds, ctx)
    assert rel_l2(got["y"], want) <= 1e-6
    assert "Transpose" in ops + [m for ms in members for m in ms], ops
