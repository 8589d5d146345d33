"""The GPU's pointwise kernels taking 4 elements per work-item (Options.ew_vector=4: vector loads of the operands
contiguous along the innermost dim, broadcast ones loaded once, one vector store), run on the test device taken
for a GPU: chains with broadcasts along either dim, half storage, bool and integer values, and the shapes that keep
one element per work-item (an innermost dim not a multiple of 4, a transpose, a view at an odd offset), against
NumPy."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from tests.conftest import make_model, rel_l2

from .test_reduce_split import gpu_like

R = np.random.default_rng(11)


def net_of(nodes, feeds, inits=None, precision="fp32", vec=4):
    ctx = gpu_like().with_options(ew_vector=vec)
    if precision != "fp32":
        ctx = dlnet.Context(ctx.info, precision=precision, options=ctx.options)
        ctx.is_cpu = False
    return dlnet.Net(ctx).load_onnx(make_model(nodes, feeds, ["y"], inits or {}))


def vector_kernels(net, marks=("vstore4", "vstore_half4"), label=""):
    """How many of the net's launches (those whose label holds `label`) are vector pointwise kernels (their source
    holds one of `marks`)."""
    from dlnet.kernels.runtime import cl
    return sum(any(m in launch.kernel.program.get_info(cl.program_info.SOURCE) for m in marks)
               for launch in net.launches if label in launch.label)


@pytest.mark.parametrize("a_shape,b_shape", [((6, 40), (40,)),        # bias along the inner dim (stride 1)
                                             ((6, 40), (6, 1)),       # one value per row (inner stride 0)
                                             ((2, 3, 8, 12), (3, 1, 1)),
                                             ((1000,), (1,))])
def test_chain_with_broadcasts(a_shape, b_shape):
    a, b = R.standard_normal(a_shape).astype(np.float32), R.standard_normal(b_shape).astype(np.float32)
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Add", ["m", "a"], ["s"]),
             helper.make_node("Tanh", ["s"], ["y"])]
    net = net_of(nodes, {"a": a, "b": b})
    got = net.run({"a": a, "b": b})["y"]
    assert vector_kernels(net) == 1
    assert rel_l2(got, np.tanh(a.astype(np.float64) * b + a)) < 1e-6


def test_comparisons_select_and_integers():
    a, b = R.standard_normal((5, 24)).astype(np.float32), R.standard_normal((5, 24)).astype(np.float32)
    i = R.integers(-50, 50, (5, 24)).astype(np.int64)
    nodes = [helper.make_node("Greater", ["a", "b"], ["g"]), helper.make_node("Where", ["g", "a", "b"], ["w"]),
             helper.make_node("Add", ["i", "i"], ["j"]), helper.make_node("Cast", ["j"], ["f"], to=1),
             helper.make_node("Add", ["w", "f"], ["y"])]
    net = net_of(nodes, {"a": a, "b": b, "i": i})
    got = net.run({"a": a, "b": b, "i": i})["y"]
    assert vector_kernels(net) >= 1
    assert rel_l2(got, np.maximum(a, b).astype(np.float64) + 2 * i) < 1e-6


def test_values_stored_in_half():
    """precision fp16: the chain between two products reads and writes half (vload_half4 / vstore_half4)."""
    x = R.standard_normal((16, 32)).astype(np.float32)
    w1, w2 = (R.standard_normal((32, 32)) / 6).astype(np.float32), (R.standard_normal((32, 8)) / 6).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Sigmoid", ["h"], ["s"]),
             helper.make_node("Mul", ["s", "h"], ["g"]), helper.make_node("MatMul", ["g", "w2"], ["y"])]
    net = net_of(nodes, {"x": x}, {"w1": w1, "w2": w2}, precision="fp16")
    got = net.run({"x": x})["y"]
    assert vector_kernels(net, ("vload_half4",)) >= 1 and vector_kernels(net, ("vstore_half4",)) >= 1
    h = x.astype(np.float64) @ w1
    assert rel_l2(got, (h / (1 + np.exp(-h))) @ w2) < 5e-3
    fp32 = net_of(nodes, {"x": x}, {"w1": w1, "w2": w2}, vec=1)
    assert rel_l2(got, fp32.run({"x": x})["y"]) < 5e-3


@pytest.mark.parametrize("case", ["odd inner dim", "transpose", "odd offset"])
def test_shapes_that_keep_one_element_per_work_item(case):
    x = R.standard_normal((6, 20 if case != "odd inner dim" else 19)).astype(np.float32)
    if case == "transpose":
        nodes, want = [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], x.T
    elif case == "odd offset":  # a slice from column 1, copied: its rows do not start on a multiple of 4
        starts, ends, axes = (np.array(v, np.int64) for v in ([1], [17], [1]))
        nodes = [helper.make_node("Slice", ["x", "s", "e", "a"], ["v"]), helper.make_node("Neg", ["v"], ["y"])]
        net = net_of(nodes, {"x": x}, {"s": starts, "e": ends, "a": axes})
        assert rel_l2(net.run({"x": x})["y"], -x[:, 1:17]) < 1e-7
        assert vector_kernels(net, label="copy") == 0 and vector_kernels(net, label="Neg") == 1
        return
    else:
        nodes, want = [helper.make_node("Exp", ["x"], ["y"])], np.exp(x)
    net = net_of(nodes, {"x": x})
    got = net.run({"x": x})["y"]
    assert vector_kernels(net) == 0
    assert rel_l2(got, want) < 1e-6
