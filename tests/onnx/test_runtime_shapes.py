"""Shapes decided at run time: a value that decides a shape (Reshape's shape, Slice's starts, Expand's shape, ...)
fed as a graph input, and symbolic dims other than batch. The net plans once per distinct value and keeps a bounded
cache of plans; each run is checked against onnx.reference, feeding two values in turn and going back to the first
(a plan kept for the wrong value would give the wrong shape there)."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import dlnet
from tests.conftest import make_model, reference, rel_l2

RNG = np.random.default_rng()


def _floats(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _ints(*values):
    return np.array(values, np.int64)


# (id, nodes, inputs {name: (dtype, shape)}, outputs, op-set, [feeds of the first value, of the second])
CASES = [
    ("reshape", [helper.make_node("Reshape", ["x", "s"], ["y"])],
     {"x": ("float32", [4, 6]), "s": ("int64", [2])}, ["y"], 13,
     [{"s": _ints(3, 8)}, {"s": _ints(-1, 2)}]),
    ("reshape_of_a_computed_shape", [helper.make_node("Add", ["s", "one"], ["s1"]),
                                     helper.make_node("Reshape", ["x", "s1"], ["y"])],
     {"x": ("float32", [4, 6]), "s": ("int64", [3])}, ["y"], 13,
     [{"s": _ints(1, 2, 3)}, {"s": _ints(3, 1, 2)}]),
    ("slice", [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])],
     {"x": ("float32", [5, 7]), "st": ("int64", [2]), "en": ("int64", [2]), "ax": ("int64", [2]),
      "sp": ("int64", [2])}, ["y"], 13,
     [{"st": _ints(1, 0), "en": _ints(4, 7), "ax": _ints(0, 1), "sp": _ints(1, 2)},
      {"st": _ints(6, -1), "en": _ints(0, -100), "ax": _ints(1, 0), "sp": _ints(-2, -1)}]),
    ("expand", [helper.make_node("Expand", ["x", "s"], ["y"])],
     {"x": ("float32", [3, 1]), "s": ("int64", [3])}, ["y"], 13,
     [{"s": _ints(2, 1, 4)}, {"s": _ints(1, 3, 1)}]),
    ("tile", [helper.make_node("Tile", ["x", "r"], ["y"])],
     {"x": ("float32", [2, 3]), "r": ("int64", [2])}, ["y"], 13,
     [{"r": _ints(1, 3)}, {"r": _ints(2, 1)}]),
    ("reduce_axes", [helper.make_node("ReduceSum", ["x", "a"], ["y"], keepdims=0)],
     {"x": ("float32", [3, 4, 5]), "a": ("int64", [1])}, ["y"], 13,
     [{"a": _ints(1)}, {"a": _ints(-1)}]),
    ("reduce_max_axes_18", [helper.make_node("ReduceMax", ["x", "a"], ["y"], keepdims=1)],
     {"x": ("float32", [3, 4, 5]), "a": ("int64", [2])}, ["y"], 18,
     [{"a": _ints(0, 2)}, {"a": _ints(1, 0)}]),
    ("topk", [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)],
     {"x": ("float32", [3, 8]), "k": ("int64", [1])}, ["v", "i"], 11,
     [{"k": _ints(2)}, {"k": _ints(5)}]),
    ("resize_sizes", [helper.make_node("Resize", ["x", "", "", "sz"], ["y"], mode="linear")],
     {"x": ("float32", [1, 2, 4, 5]), "sz": ("int64", [4])}, ["y"], 13,
     [{"sz": _ints(1, 2, 8, 3)}, {"sz": _ints(1, 2, 3, 10)}]),
    ("resize_scales", [helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest")],
     {"x": ("float32", [1, 2, 4, 5]), "sc": ("float32", [4])}, ["y"], 13,
     [{"sc": np.array([1, 1, 2, 0.6], np.float32)}, {"sc": np.array([1, 1, 0.5, 3], np.float32)}]),
    ("range", [helper.make_node("Range", ["a", "b", "d"], ["r"]), helper.make_node("Cast", ["r"], ["y"], to=1)],
     {"a": ("int64", []), "b": ("int64", []), "d": ("int64", [])}, ["y"], 11,
     [{"a": np.array(2, np.int64), "b": np.array(9, np.int64), "d": np.array(3, np.int64)},
      {"a": np.array(5, np.int64), "b": np.array(-4, np.int64), "d": np.array(-2, np.int64)}]),
    ("constant_of_shape", [helper.make_node("ConstantOfShape", ["s"], ["c"],
                                            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])),
                           helper.make_node("Add", ["c", "x"], ["y"])],
     {"s": ("int64", [2]), "x": ("float32", [1])}, ["y"], 13,
     [{"s": _ints(2, 3)}, {"s": _ints(4, 1)}]),
    ("onehot", [helper.make_node("OneHot", ["i", "depth", "vals"], ["y"], axis=-1)],
     {"i": ("int64", [5]), "depth": ("int64", []), "vals": ("float32", [2])}, ["y"], 11,
     [{"i": _ints(0, 3, 1, -1, 2), "depth": np.array(4, np.int64)},
      {"i": _ints(0, 3, 1, -1, 2), "depth": np.array(7, np.int64)}]),
    ("pad", [helper.make_node("Pad", ["x", "p", "v"], ["y"], mode="constant")],
     {"x": ("float32", [3, 4]), "p": ("int64", [4]), "v": ("float32", [])}, ["y"], 13,
     [{"p": _ints(1, 0, 2, 3)}, {"p": _ints(0, 2, 1, 0)}]),
    ("split", [helper.make_node("Split", ["x", "sp"], ["y0", "y1"], axis=1)],
     {"x": ("float32", [2, 7]), "sp": ("int64", [2])}, ["y0", "y1"], 13,
     [{"sp": _ints(3, 4)}, {"sp": _ints(6, 1)}]),
]


def _branch(name, shape):
    value = helper.make_tensor("v", TensorProto.INT64, [len(shape)], shape)
    return helper.make_graph([helper.make_node("Constant", [], [f"{name}_s"], value=value)], name, [],
                             [helper.make_tensor_value_info(f"{name}_s", TensorProto.INT64, [len(shape)])])


CASES.append(("if_condition", [helper.make_node("If", ["c"], ["s"], then_branch=_branch("then", [3, 8]),
                                                else_branch=_branch("else", [2, 2, 6])),
                               helper.make_node("Reshape", ["x", "s"], ["y"])],
              {"c": ("bool", []), "x": ("float32", [4, 6])}, ["y"], 13,
              [{"c": np.array(True)}, {"c": np.array(False)}]))


def _fill(feeds, inputs):
    out = dict(feeds)
    for name, (dtype, shape) in inputs.items():
        if name not in out:
            out[name] = _floats(*shape) if dtype == "float32" else RNG.integers(0, 3, shape).astype(dtype)
    return out


def _model(nodes, inputs, outputs, opset, extra=None):
    model = make_model(nodes, inputs, outputs, extra or {}, opset=opset)
    for o in model.graph.output:  # (make_model declares float outputs; let the importer infer them)
        o.type.tensor_type.elem_type = 0
    return model


def _check(net, model, feeds):
    got = net.run(feeds)
    want = reference(model, feeds)
    assert list(got) == [o.name for o in model.graph.output]
    for y, w in zip(got.values(), want):
        assert y.shape == w.shape, (y.shape, w.shape)
        assert y.dtype == w.dtype
        if w.dtype.kind == "f":
            assert rel_l2(y, w) < 1e-5
        else:
            np.testing.assert_array_equal(y, w)


@pytest.mark.parametrize("name,nodes,inputs,outputs,opset,values", CASES, ids=[c[0] for c in CASES])
def test_a_shape_input_fed_at_run_time(ctx, name, nodes, inputs, outputs, opset, values):
    extra = {"one": _ints(1)} if name == "reshape_of_a_computed_shape" else None
    model = _model(nodes, inputs, outputs, opset, extra)
    net = dlnet.Net(ctx).load_onnx(model)
    feeds = [_fill(v, inputs) for v in values]
    for f in (feeds[0], feeds[1], feeds[0], feeds[1]):
        _check(net, model, f)
    net.close()


def test_the_plan_cache_is_bounded_and_keyed_by_value(ctx):
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": ("float32", [4, 6]), "s": ("int64", [2])},
                   ["y"], 13)
    net = dlnet.Net(ctx, max_plans=2).load_onnx(model)
    x = _floats(4, 6)
    shapes = [_ints(2, 12), _ints(8, 3), _ints(24, 1), _ints(2, 12)]
    for s in shapes:
        (y,) = net.run({"x": x, "s": s}).values()
        assert y.shape == tuple(s) and np.array_equal(y, x.reshape(s))
        assert len(net.plans) <= 2
    assert net.value_inputs == {"s"}  # bound per value: one device plan each, no host step
    assert net.graph.cut is None
    net.close()


def test_constants_still_fix_a_shape_at_load(ctx):
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": ("float32", [4, 6]), "s": ("int64", [2])},
                   ["y"], 13)
    net = dlnet.Net(ctx).load_onnx(model, constants={"s": _ints(3, 8)})
    assert [i.name for i in net.inputs] == ["x"]
    x = _floats(4, 6)
    (y,) = net.run({"x": x}).values()
    assert np.array_equal(y, x.reshape(3, 8))
    net.close()


def test_a_shape_computed_on_the_device_from_float_data(ctx):
    """The shape comes from a float tensor the device computes (ReduceMax, Cast): it is known only after the first
    part runs; the rest is planned per value."""
    nodes = [helper.make_node("ReduceMax", ["c"], ["m"], keepdims=0, axes=[0]),
             helper.make_node("Cast", ["m"], ["s"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "s"], ["y"])]
    model = _model(nodes, {"x": ("float32", [4, 6]), "c": ("float32", [3, 2])}, ["y"], 13)
    net = dlnet.Net(ctx).load_onnx(model)
    x = _floats(4, 6)
    for s in ([2, 12], [6, 4], [2, 12]):
        c = np.array([s, [1, 1], [0, 0]], np.float32)
        _check(net, model, {"x": x, "c": c})
    assert not net.value_inputs and "stops before ONNX node #2" in str(net.graph)
    (plan,) = net.plans.values()
    assert len(plan.rest) == 2  # the rest planned once per value
    net.close()


def test_scalars_computed_on_the_device_decide_a_range(ctx):
    """Range's start computed from a float scalar input (not bound: the graph stops before Range); the scalars the
    rest reads keep their rank 0."""
    nodes = [helper.make_node("Add", ["a", "half"], ["a2"]),
             helper.make_node("Range", ["a2", "b", "d"], ["y"]),
             helper.make_node("Neg", ["a"], ["z"])]
    model = _model(nodes, {"a": ("float32", []), "b": ("float32", []), "d": ("float32", [])}, ["y", "z"], 11,
                   {"half": np.array(0.5, np.float32)})
    net = dlnet.Net(ctx).load_onnx(model)
    first = {"a": np.array(1.25, np.float32), "b": np.array(7.5, np.float32), "d": np.array(1.5, np.float32)}
    second = {"a": np.array(4, np.float32), "b": np.array(-3, np.float32), "d": np.array(-0.75, np.float32)}
    for f in (first, second, first):
        _check(net, model, f)
    assert "stops before ONNX node #1" in str(net.graph)
    net.close()


def _attention_model(d=8):
    """A transformer-like block over x[batch, seq, d] whose Reshapes are driven by Shape ops (as exporters write
    them): q, k, v projections, heads split by Reshape(Concat(Shape...)), Softmax(q k^T / sqrt), merged back."""
    heads = 2
    w = {f"w{n}": (RNG.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32) for n in "qkvo"}
    consts = dict(w, i0=_ints(0), i1=_ints(1), hd=_ints(heads, d // heads), dm=_ints(d),
                  scale=np.array(1 / np.sqrt(d // heads), np.float32))
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "i0"], ["b"], axis=0),
             helper.make_node("Gather", ["sh", "i1"], ["t"], axis=0),
             helper.make_node("Concat", ["b", "t", "hd"], ["split_shape"], axis=0),
             helper.make_node("Concat", ["b", "t", "dm"], ["merge_shape"], axis=0)]
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}0"]),
                  helper.make_node("Reshape", [f"{n}0", "split_shape"], [f"{n}1"]),
                  helper.make_node("Transpose", [f"{n}1"], [n], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["s0"]),
              helper.make_node("Mul", ["s0", "scale"], ["s"]),
              helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o0"]),
              helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o1", "merge_shape"], ["o2"]),
              helper.make_node("MatMul", ["o2", "wo"], ["y"])]
    return _model(nodes, {"x": ("float32", ["batch", "seq", d])}, ["y"], 13, consts)


def test_a_symbolic_sequence_length_runs_at_two_lengths_in_one_net(ctx):
    model = _attention_model()
    net = dlnet.Net(ctx).load_onnx(model, batch=2)
    feeds = [{"x": _floats(2, 5, 8)}, {"x": _floats(2, 11, 8)}]
    for f in (feeds[0], feeds[1], feeds[0]):
        _check(net, model, f)
    assert len(net.plans) == 2
    net.close()


def test_a_sequence_length_and_a_shape_input_together(ctx):
    """A symbolic sequence dim and a run-time Reshape shape in one model: the plan is keyed by both."""
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    model = _model(nodes, {"x": ("float32", [2, "seq"]), "s": ("int64", [2])}, ["y"], 13)
    net = dlnet.Net(ctx).load_onnx(model)
    runs = [(6, [3, 4]), (6, [4, 3]), (10, [4, 5]), (6, [3, 4])]
    for seq, s in runs:
        _check(net, model, {"x": _floats(2, seq), "s": _ints(*s)})
    assert len(net.plans) == 3
    net.close()


def test_a_wrong_run_time_shape_is_an_input_error_naming_the_node(ctx):
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="the_reshape")],
                   {"x": ("float32", [4, 6]), "s": ("int64", [2])}, ["y"], 13)
    net = dlnet.Net(ctx).load_onnx(model)
    with pytest.raises(dlnet.InputError, match=r"the_reshape.*cannot reshape \[4, 6\] to \[5, 5\].*input\(s\) s\)"):
        net.run({"x": _floats(4, 6), "s": _ints(5, 5)})
    (y,) = net.run({"x": _floats(4, 6), "s": _ints(6, 4)}).values()
    assert y.shape == (6, 4)
    net.close()
