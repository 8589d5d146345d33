"""The ml_dtypes types against onnx.reference on fresh random inputs: bfloat16 (float32 on the device, rounded to
bfloat16 wherever ONNX makes one: Cast, MatMul, Add, Relu; fed and returned as ml_dtypes.bfloat16 arrays); float8
and int4 through Cast and DequantizeLinear on the host; the error for a dtype an op cannot take names node and
dtype."""
import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import dlnet

from ..conftest import context, reference, rel_l2

rng = np.random.default_rng()
BF16 = ml_dtypes.bfloat16


def model_of(nodes, inputs, outputs, inits=None, opset=21):
    """inputs, outputs: [(name, ONNX type, shape)]; inits: {name: array}."""
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs],
                              [onnx.numpy_helper.from_array(a, n) for n, a in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def run(model, feeds):
    got = dlnet.Net(context()).load_onnx(model).run(feeds)
    return got, dict(zip(got, reference(model, feeds)))


def bits(a):
    return np.asarray(a).view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def test_cast_round_trip_rounds_to_nearest_even():
    x = rng.standard_normal(4096).astype(np.float32) * np.float32(100)
    # ties: the low 16 bits exactly half way, above odd and even bfloat16 mantissas; and past bfloat16's largest
    ties = (rng.integers(0x3f000000, 0x43000000, 64, dtype=np.uint32) & 0xffff0000 | 0x8000).view(np.float32)
    x = np.concatenate([x, ties, np.float32([3.4e38, -3.4e38, 0.0, -1e-40])])
    model = model_of([helper.make_node("Cast", ["x"], ["b"], to=T.BFLOAT16),
                      helper.make_node("Cast", ["b"], ["y"], to=T.FLOAT)],
                     [("x", T.FLOAT, [x.size])], [("b", T.BFLOAT16, [x.size]), ("y", T.FLOAT, [x.size])])
    got, want = run(model, {"x": x})
    assert got["b"].dtype == BF16 and got["y"].dtype == np.float32
    assert np.array_equal(bits(got["b"]), bits(want["b"]))
    assert np.array_equal(bits(got["y"]), bits(want["y"]))
    assert not np.array_equal(got["y"], x)  # (it did round)


def test_elementwise_chain_rounds_after_each_node():
    """x * y + z in bfloat16: the product is rounded before the sum, as the reference does, so bits agree."""
    a, b, c = (rng.standard_normal((8, 33)).astype(BF16) for _ in range(3))
    model = model_of([helper.make_node("Mul", ["a", "b"], ["p"]), helper.make_node("Add", ["p", "c"], ["s"]),
                      helper.make_node("Relu", ["s"], ["y"])],
                     [(n, T.BFLOAT16, [8, 33]) for n in "abc"], [("y", T.BFLOAT16, [8, 33])])
    got, want = run(model, {"a": a, "b": b, "c": c})
    assert got["y"].dtype == BF16 and got["y"].shape == (8, 33)
    assert np.array_equal(bits(got["y"]), bits(want["y"]))


def test_matmul_add_relu_with_bfloat16_weights():
    x = rng.standard_normal((5, 48)).astype(BF16)
    w = rng.standard_normal((48, 24)).astype(BF16)
    bias = rng.standard_normal(24).astype(BF16)
    model = model_of([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
                      helper.make_node("Relu", ["a"], ["y"])],
                     [("x", T.BFLOAT16, [5, 48])], [("y", T.BFLOAT16, [5, 24])], {"w": w, "b": bias})
    got, want = run(model, {"x": x})
    assert got["y"].dtype == BF16
    # every value a bfloat16 (rounded on the device), close to the reference (which sums in another order)
    assert np.array_equal(got["y"].astype(np.float32).astype(BF16), got["y"])
    assert rel_l2(got["y"].astype(np.float64), want["y"].astype(np.float64)) < 1e-2
    f32 = np.maximum(x.astype(np.float32) @ w.astype(np.float32) + bias.astype(np.float32), 0)
    assert rel_l2(got["y"].astype(np.float64), f32) < 1e-2


def test_bfloat16_input_must_be_bfloat16():
    model = model_of([helper.make_node("Relu", ["x"], ["y"])], [("x", T.BFLOAT16, [4])], [("y", T.BFLOAT16, [4])])
    net = dlnet.Net(context()).load_onnx(model)
    with pytest.raises(dlnet.InputError, match="'x' has dtype float32, expected bfloat16"):
        net.run({"x": rng.standard_normal(4).astype(np.float32)})


@pytest.mark.parametrize("dtype", [T.FLOAT8E4M3FN, T.FLOAT8E5M2, T.INT4, T.UINT4])
def test_float8_int4_cast_at_run_time(dtype):
    """float32 -> float8 / int4 -> float32: a host step, exactly the reference's (saturating) conversion."""
    x = (rng.standard_normal(64) * 4).astype(np.float32)
    model = model_of([helper.make_node("Cast", ["x"], ["q"], to=dtype),
                      helper.make_node("Cast", ["q"], ["y"], to=T.FLOAT),
                      helper.make_node("Mul", ["y", "y"], ["z"])],
                     [("x", T.FLOAT, [64])], [("q", dtype, [64]), ("z", T.FLOAT, [64])])
    got, want = run(model, {"x": x})
    assert got["q"].dtype == want["q"].dtype
    assert np.array_equal(got["q"].astype(np.float32), want["q"].astype(np.float32))
    assert rel_l2(got["z"], want["z"]) < 1e-6


def test_dequantize_float8_weights_fold_at_load():
    w = (rng.standard_normal((16, 8)) * 3).astype(ml_dtypes.float8_e4m3fn)
    scale = np.float32(rng.uniform(0.5, 2))
    x = rng.standard_normal((3, 16)).astype(np.float32)
    model = model_of([helper.make_node("DequantizeLinear", ["w", "s"], ["wf"]),
                      helper.make_node("MatMul", ["x", "wf"], ["y"])],
                     [("x", T.FLOAT, [3, 16])], [("y", T.FLOAT, [3, 8])], {"w": w, "s": np.asarray(scale)})
    net = dlnet.Net(context()).load_onnx(model)
    got = net.run({"x": x})["y"]
    assert rel_l2(got, reference(model, {"x": x})[0]) < 1e-6
    assert "DequantizeLinear" not in str(net.graph)  # folded: the device sees a float32 weight


def test_op_that_cannot_take_the_dtype_names_node_and_dtype():
    model = model_of([helper.make_node("Cast", ["x"], ["q"], to=T.FLOAT8E4M3FN),
                      helper.make_node("Transpose", ["q"], ["y"], name="flip")],
                     [("x", T.FLOAT, [2, 3])], [("y", T.FLOAT8E4M3FN, [3, 2])])
    with pytest.raises(dlnet.ModelError, match=r"node flip \(Transpose\): dtype float8_e4m3fn is not supported"):
        dlnet.Net(context()).load_onnx(model).run({"x": rng.standard_normal((2, 3)).astype(np.float32)})


def test_a_branch_reads_its_initializers_as_the_graph_does():
    """An If branch's own initializers are read as the graph's own: a uint4 one read by Mul is refused with the node's
    name (a fuzzed model once reached the kernel generator with it); uint4 and bfloat16 ones through Cast (on the
    host) scale x."""
    def branch(name, init, cast):
        nodes = [helper.make_node("Cast", ["k"], ["kf"], to=T.FLOAT)] if cast else []
        nodes.append(helper.make_node("Mul", ["x", "kf" if cast else "k"], ["o"], name=name))
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info("o", T.FLOAT, None)], [init])

    x = rng.standard_normal((2, 3)).astype(np.float32)
    for init, k, cast in [(helper.make_tensor("k", T.UINT4, [3], [1, 2, 3]), [1, 2, 3], False),
                          (helper.make_tensor("k", T.UINT4, [3], [1, 2, 3]), [1, 2, 3], True),
                          (helper.make_tensor("k", T.BFLOAT16, [3], [1.5, 2.0, -0.5]), [1.5, 2.0, -0.5], True)]:
        model = model_of([helper.make_node("If", ["c"], ["y"], then_branch=branch("scale", init, cast),
                                           else_branch=branch("other", init, cast))],
                         [("x", T.FLOAT, [2, 3])], [("y", T.FLOAT, [2, 3])], {"c": np.asarray(True)})
        if not cast:
            with pytest.raises(dlnet.ModelError, match=r"node scale \(Mul\): dtype uint4 is not supported"):
                dlnet.Net(context()).load_onnx(model).run({"x": x})
            continue
        got = dlnet.Net(context()).load_onnx(model).run({"x": x})["y"]
        assert rel_l2(got, x * np.asarray(k, np.float32)) < 1e-7


def test_dtype_numpy_does_not_hold_names_input():
    model = model_of([helper.make_node("Identity", ["x"], ["y"])], [("x", T.COMPLEX64, [2])],
                     [("y", T.COMPLEX64, [2])])
    with pytest.raises(dlnet.ModelError, match="input 'x': dtype COMPLEX64 is not supported"):
        dlnet.Net(context()).load_onnx(model)


def test_bfloat16_rounding_goes_on_after_a_host_step():
    """NonZero runs on the host; the bfloat16 value `a` made before it is still rounded to after (bits agree)."""
    x = rng.standard_normal(40).astype(BF16)
    model = model_of([helper.make_node("Mul", ["x", "x"], ["a"]), helper.make_node("NonZero", ["x"], ["nz"]),
                      helper.make_node("Add", ["a", "x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])],
                     [("x", T.BFLOAT16, [40])], [("y", T.BFLOAT16, [40]), ("nz", T.INT64, None)])
    got, want = run(model, {"x": x})
    assert np.array_equal(got["nz"], want["nz"])
    assert np.array_equal(bits(got["y"]), bits(want["y"]))


def test_round_bfloat16_passes_the_gradient_straight_through():
    """d/dx sum(RoundBfloat16(x) * w) = w: rounding's own derivative (0 almost everywhere) would stop bfloat16
    training, so the rule is the straight-through estimator."""
    from dlnet.graph.autodiff import gradients
    from dlnet.graph.ir import Builder, Graph
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", "float32", (7,))
    w = rng.standard_normal(7).astype(np.float32)
    loss = b.op("Reduce", [b.op("Mul", [b.op("RoundBfloat16", [x]), g.constant(w)])],
                {"mode": "sum", "axes": (0,), "keepdims": 0})
    (dx,) = gradients(g, loss, [x])
    assert dx.const is not None and rel_l2(dx.const, w) == 0


def test_bfloat16_weights_in_an_external_data_file(tmp_path):
    """A bfloat16 initializer in `.onnx.data` is 2 bytes an element (its length is checked against that)."""
    w = rng.standard_normal((64, 32)).astype(BF16)
    model = model_of([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", T.BFLOAT16, [2, 64])],
                     [("y", T.BFLOAT16, [2, 32])], {"w": w})
    x = rng.standard_normal((2, 64)).astype(BF16)
    want = reference(model, {"x": x})[0]
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.onnx.data",
              size_threshold=0)
    assert (tmp_path / "m.onnx.data").stat().st_size == w.size * 2
    got = dlnet.Net(context()).load_onnx(str(tmp_path / "m.onnx")).run({"x": x})["y"]
    assert got.dtype == BF16 and rel_l2(got.astype(np.float64), want.astype(np.float64)) < 1e-2
