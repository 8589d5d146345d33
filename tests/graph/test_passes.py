"""Each pass on a small graph, shown by the printed IR (golden text), with verify() after every pass."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.graph.ir import Graph, Node
from dlnet.graph.passes import fold_batchnorm, fuse_epilogues, fuse_pointwise, remove_dead
from tests.conftest import make_model, rel_l2

R = np.random.default_rng(0)


def build(ctx, nodes, inputs, inits, opset=13, passes=True):
    model = make_model(nodes, inputs, ["y"], inits, opset=opset)
    net = dlnet.Net(ctx).load_onnx(model)
    shapes = {k: tuple(v[1]) for k, v in inputs.items()}
    return net, net.build_graph(shapes, passes=passes)


def body(graph):
    """The node lines of the printed IR, without the memory/name comments."""
    return [line.split("   #")[0].strip() for line in str(graph).splitlines()[1:-1] if not line.strip().startswith("#")]


def test_shape_chain_folds_and_pointwise_chain_fuses(ctx):
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["nu"]), helper.make_node("Concat", ["nu", "m1"], ["shp"], axis=0),
             helper.make_node("Reshape", ["x", "shp"], ["flat"]), helper.make_node("Add", ["flat", "c"], ["a"]),
             helper.make_node("Mul", ["a", "c"], ["b"]), helper.make_node("Sigmoid", ["b"], ["y"]),
             helper.make_node("Exp", ["x"], ["unused"])]
    inits = {"i0": np.array(0, np.int64), "ax": np.array([0], np.int64), "m1": np.array([-1], np.int64),
             "c": R.standard_normal(12).astype(np.float32)}
    net, g = build(ctx, nodes, {"x": ("float32", [2, 3, 4])}, inits)
    assert body(g) == ["%9: f32[2,12] = Reshape(%4) {shape=2,12}",
                       "%12: f32[2,12] = Fused[Add+Mul+Sigmoid](%9, $3)",
                       "return %12 \"y\""]
    x = R.standard_normal((2, 3, 4)).astype(np.float32)
    c = inits["c"]
    want = 1 / (1 + np.exp(-((x.reshape(2, 12) + c) * c)))
    assert rel_l2(net.run({"x": x})["y"], want) < 1e-6
    assert len(net._last.launches) == 1  # the reshape is a view, the chain one kernel


def test_batchnorm_folds_into_conv_with_relu_epilogue(ctx):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "s", "b", "mu", "v"], ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["y"], name="relu")]
    inits = {"w": R.standard_normal((4, 2, 3, 3)).astype(np.float32), "s": R.uniform(0.5, 2, 4).astype(np.float32),
             "b": R.standard_normal(4).astype(np.float32), "mu": R.standard_normal(4).astype(np.float32),
             "v": R.uniform(0.5, 2, 4).astype(np.float32)}
    net, before = build(ctx, nodes, {"x": ("float32", [1, 2, 5, 5])}, inits, passes=False)
    assert [line.split(" = ")[1].split("(")[0] for line in body(before)[:-1]] == ["Conv", "BatchNormalization", "Relu"]
    fold_batchnorm(before)
    before.verify()
    assert body(before)[0] == "%6: f32[1,4,5,5] = Conv(%5, $9, $10) {strides=1,1, pads=1,1,1,1, dilations=1,1, group=1, " \
                              "fused=bias}"
    fuse_epilogues(before)
    before.verify()
    assert body(before) == ["%8: f32[1,4,5,5] = Conv(%5, $9, $10) {strides=1,1, pads=1,1,1,1, dilations=1,1, group=1, "
                            "fused=bias+relu}", "return %8 \"y\""]


def test_batchnorm_alone_becomes_scale_shift(ctx):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("BatchNormalization", ["r", "s", "b", "mu", "v"], ["y"])]
    inits = {k: R.uniform(0.5, 2, 3).astype(np.float32) for k in ("s", "b", "mu", "v")}
    net, g = build(ctx, nodes, {"x": ("float32", [2, 3, 4, 4])}, inits)
    assert body(g) == ["%6: f32[2,3,4,4] = Fused[Relu+Mul+Add](%4, $8, $9)", "return %6 \"y\""]


def test_dead_code_removed():
    g = Graph()
    x = g.add_input("x", "float32", (3,))
    y, z = g.new_value("float32", (3,)), g.new_value("float32", (3,))
    g.add_node(Node("Relu", [x], [y], {}))
    g.add_node(Node("Exp", [x], [z], {}))
    g.outputs, g.output_names = [y], ["y"]
    assert remove_dead(g) is True
    assert [n.op for n in g.nodes] == ["Relu"] and not x.users[1:]
    assert remove_dead(g) is False


def test_verify_catches_wrong_types_and_order():
    g = Graph()
    x = g.add_input("x", "float32", (3,))
    y = g.new_value("float32", (4,))
    g.add_node(Node("Relu", [x], [y], {}))
    g.outputs = [y]
    with pytest.raises(dlnet.ModelError, match="inference says float32\\[3\\]"):
        g.verify()
    g2 = Graph()
    x = g2.add_input("x", "float32", (3,))
    a, b = g2.new_value("float32", (3,)), g2.new_value("float32", (3,))
    n2 = Node("Exp", [a], [b], {})
    n1 = Node("Relu", [x], [a], {})
    g2.add_node(n2)
    g2.add_node(n1)
    with pytest.raises(dlnet.ModelError, match="before it is defined"):
        g2.verify()


def test_inplace_and_liveness_reuse(ctx):
    # a chain of convs with a Relu between that cannot fuse (two readers): buffers are reused, not one per value
    nodes = [helper.make_node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c2", "w"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c3", "r1"], ["a"]), helper.make_node("Conv", ["a", "w"], ["y"], pads=[1, 1, 1, 1])]
    w = (R.standard_normal((4, 4, 3, 3)) * 0.2).astype(np.float32)
    net, g = build(ctx, nodes, {"x": ("float32", [1, 4, 16, 16])}, {"w": w})
    mem = net.memory
    assert mem.activations < mem.naive_activations
    # x (input, lives throughout), r1 (read by the residual), c2, c3+r1; y reuses c2's block: 4 of 5 buffers
    assert mem.activations == 4 * (4 * 16 * 16 * 4)
    x = R.standard_normal((1, 4, 16, 16)).astype(np.float32)
    from tests.conftest import reference
    want = reference(make_model(nodes, {"x": ("float32", [1, 4, 16, 16])}, ["y"], {"w": w}), {"x": x})[0]
    assert rel_l2(net.run({"x": x})["y"], want) < 1e-5


def test_fuse_pointwise_keeps_shared_values():
    g = Graph()
    x = g.add_input("x", "float32", (3,))
    a, b, c = (g.new_value("float32", (3,)) for _ in range(3))
    g.add_node(Node("Exp", [x], [a], {}))
    g.add_node(Node("Neg", [a], [b], {}))
    g.add_node(Node("Add", [a, b], [c], {}))
    g.outputs, g.output_names = [c, a], ["c", "a"]
    fuse_pointwise(g)
    g.verify()
    assert [n.op for n in g.nodes] == ["Exp", "Fused"]  # a is an output: computed once, not folded into the group
