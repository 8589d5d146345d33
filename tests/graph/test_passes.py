"""Each pass on a small graph, shown by the printed IR (golden text), with verify() after every pass."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.graph.ir import Graph, Node
from dlnet.graph.passes import fold_batchnorm, fuse_epilogues, fuse_pointwise, normalize_layers, remove_dead
from dlnet.graph.passes.fuse import broadcast_expands, fuse_reduce_prologues
from dlnet.net import Plan
from tests.conftest import make_model, rel_l2

R = np.random.default_rng(0)


def build(ctx, nodes, inputs, inits, opset=13, passes=True):
    model = make_model(nodes, inputs, ["y"], inits, opset=opset)
    net = dlnet.Net(ctx).load_onnx(model)
    shapes = {k: tuple(v[1]) for k, v in inputs.items()}
    return net, net.build_graph(shapes, passes=passes)


def body(graph):
    """The node lines of the printed IR (to its closing brace), without the memory/name comments."""
    lines = str(graph).splitlines()
    return [line.split("   #")[0].strip() for line in lines[1:lines.index("}")] if not line.strip().startswith("#")]


def test_shape_chain_folds_and_pointwise_chain_fuses(ctx):
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["nu"]), helper.make_node("Concat", ["nu", "m1"], ["shp"], axis=0),
             helper.make_node("Reshape", ["x", "shp"], ["flat"]), helper.make_node("Add", ["flat", "c"], ["a"]),
             helper.make_node("Mul", ["a", "c"], ["b"]), helper.make_node("Sigmoid", ["b"], ["y"]),
             helper.make_node("Exp", ["x"], ["unused"])]
    inits = {"i0": np.array(0, np.int64), "ax": np.array([0], np.int64), "m1": np.array([-1], np.int64),
             "c": R.standard_normal(12).astype(np.float32)}
    net, g = build(ctx, nodes, {"x": ("float32", [2, 3, 4])}, inits)
    assert body(g) == ["%9: f32[2,12] = Reshape(%4) {shape=(2,12)}",
                       "%12: f32[2,12] = Fused(%9, $3) {nodes=[",
                       "%10: f32[2,12] = Add(%9, $3)",
                       "%11: f32[2,12] = Mul(%10, $3)",
                       "%12: f32[2,12] = Sigmoid(%11)",
                       "]}",
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
    assert body(before)[0] == "%6: f32[1,4,5,5] = Conv(%5, $9, $10) {strides=(1,1), pads=(1,1,1,1), dilations=(1,1), " \
                              "group=1}"
    fuse_epilogues(before)
    before.verify()
    assert body(before) == ["%8: f32[1,4,5,5] = Conv(%5, $9, $10) {strides=(1,1), pads=(1,1,1,1), dilations=(1,1), "
                            "group=1, act=(Relu, ())}", "return %8 \"y\""]


@pytest.mark.parametrize("bias", [True, False])
def test_per_channel_scale_and_shift_fold_into_conv(ctx, bias):
    """Caffe's Conv -> BatchNorm -> Scale (Mul, Add by per-channel constants, here [C,1,1] and [1,C,1,1]) -> Relu:
    one Conv with the Relu as its epilogue, against numpy; a Mul by a non-per-channel constant stays."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "v"], ["bn"]),
             helper.make_node("Mul", ["sc", "bn"], ["m"]), helper.make_node("Add", ["m", "sh"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Mul", ["r", "k"], ["y"])]
    inits = {"w": R.standard_normal((4, 2, 3, 3)).astype(np.float32), "b": R.standard_normal(4).astype(np.float32),
             "s": R.uniform(0.5, 2, 4).astype(np.float32), "bb": R.standard_normal(4).astype(np.float32),
             "mu": R.standard_normal(4).astype(np.float32), "v": R.uniform(0.5, 2, 4).astype(np.float32),
             "sc": R.uniform(0.5, 2, (4, 1, 1)).astype(np.float32), "sh": R.standard_normal((1, 4, 1, 1)).astype(
                 np.float32), "k": R.uniform(0.5, 2, (5,)).astype(np.float32)}
    if not bias:
        del inits["b"]
    net, g = build(ctx, nodes, {"x": ("float32", [2, 2, 5, 5])}, inits)
    ops = [line.split(" = ")[1].split("(")[0] for line in body(g)[:-1]]
    conv = body(g)[0]
    assert ops == ["Conv", "Mul"] and conv.split(" {")[0].count("$") == 2 and "act=(Relu, ())" in conv  # bias, Relu
    import onnxruntime as ort  # (onnx.reference's BatchNormalization disagrees with it and with dlnet here)
    x = R.standard_normal((2, 2, 5, 5)).astype(np.float32)
    model = make_model(nodes, {"x": x}, ["y"], inits)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert rel_l2(net.run({"x": x})["y"], want) < 1e-6


def test_batchnorm_alone_becomes_scale_shift(ctx):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("BatchNormalization", ["r", "s", "b", "mu", "v"], ["y"])]
    inits = {k: R.uniform(0.5, 2, 3).astype(np.float32) for k in ("s", "b", "mu", "v")}
    net, g = build(ctx, nodes, {"x": ("float32", [2, 3, 4, 4])}, inits)
    assert body(g) == ["%6: f32[2,3,4,4] = Fused(%4, $8, $9) {nodes=[", "%5: f32[2,3,4,4] = Relu(%4)",
                       "%7: f32[2,3,4,4] = Mul(%5, $8)", "%6: f32[2,3,4,4] = Add(%7, $9)", "]}", "return %6 \"y\""]


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
    # x (input, lives throughout), r1 (read by the residual), c2; c3 + r1 is written over r1 (its last reader),
    # y over c2's block: 3 buffers for 5 values
    assert mem.activations == 3 * (4 * 16 * 16 * 4)
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


def _layernorm_nodes(x, out, square="Pow"):
    """LayerNorm over the last axis as torch.onnx exports it at op-set 13 (square: Pow(d, 2) or Mul(d, d))."""
    sq = (helper.make_node("Pow", [f"{out}_d", "two"], [f"{out}_p"]) if square == "Pow" else
          helper.make_node("Mul", [f"{out}_d", f"{out}_d"], [f"{out}_p"]))
    return [helper.make_node("ReduceMean", [x], [f"{out}_m"], axes=[-1]),
            helper.make_node("Sub", [x, f"{out}_m"], [f"{out}_d"]), sq,
            helper.make_node("ReduceMean", [f"{out}_p"], [f"{out}_v"], axes=[-1]),
            helper.make_node("Add", [f"{out}_v", "eps"], [f"{out}_ve"]),
            helper.make_node("Sqrt", [f"{out}_ve"], [f"{out}_s"]),
            helper.make_node("Div", [f"{out}_d", f"{out}_s"], [f"{out}_n"]),
            helper.make_node("Mul", [f"{out}_n", "gamma"], [f"{out}_g"]),
            helper.make_node("Add", ["beta", f"{out}_g"], [out])]


def _transformer_norms():
    """LayerNorm -> GELU (Div by sqrt 2, x*(1+erf) then *0.5) -> LayerNorm (Mul(d,d)) -> GELU (Mul by 1/sqrt 2,
    0.5*x first) -> Relu: the orders torch and other exporters write."""
    nodes = _layernorm_nodes("x", "ln1") + [
        helper.make_node("Div", ["ln1", "sqrt2"], ["a1"]), helper.make_node("Erf", ["a1"], ["e1"]),
        helper.make_node("Add", ["e1", "one"], ["o1"]), helper.make_node("Mul", ["ln1", "o1"], ["m1"]),
        helper.make_node("Mul", ["m1", "half"], ["g1"])] + _layernorm_nodes("g1", "ln2", square="Mul") + [
        helper.make_node("Mul", ["rsqrt2", "ln2"], ["a2"]), helper.make_node("Erf", ["a2"], ["e2"]),
        helper.make_node("Add", ["one", "e2"], ["o2"]), helper.make_node("Mul", ["half", "ln2"], ["h2"]),
        helper.make_node("Mul", ["h2", "o2"], ["g2"]), helper.make_node("Relu", ["g2"], ["y"])]
    f = np.float32
    inits = {"two": f(2.0), "eps": f(1e-5), "gamma": R.uniform(0.5, 1.5, 8).astype(f),
             "beta": R.standard_normal(8).astype(f), "sqrt2": f(np.sqrt(2)), "rsqrt2": f(np.sqrt(0.5)),
             "one": f(1.0), "half": f(0.5)}
    return nodes, inits


def test_layernorm_and_gelu_decompositions_become_one_node_each(ctx):
    nodes, inits = _transformer_norms()
    net, before = build(ctx, nodes, {"x": ("float32", [2, 3, 8])}, inits, passes=False)
    assert normalize_layers(before) is True
    before.verify()
    assert body(before) == [
        "%17: f32[2,3,8] = LayerNorm(%8, $2, $3) {epsilon=1e-05f}",
        "%22: f32[2,3,8] = Gelu(%17)",
        "%31: f32[2,3,8] = LayerNorm(%22, $2, $3) {epsilon=1e-05f}",
        "%36: f32[2,3,8] = Gelu(%31)",
        "%37: f32[2,3,8] = Relu(%36)",
        "return %37 \"y\""]
    _, after = build(ctx, nodes, {"x": ("float32", [2, 3, 8])}, inits)
    assert body(after)[2:7] == ["%31: f32[2,3,8] = LayerNorm(%22, $2, $3) {epsilon=1e-05f}",
                                "%37: f32[2,3,8] = Fused(%31) {nodes=[", "%36: f32[2,3,8] = Gelu(%31)",
                                "%37: f32[2,3,8] = Relu(%36)", "]}"]
    x = R.standard_normal((2, 3, 8)).astype(np.float32) * 3 + 1
    unfused = Plan(ctx, net.build_graph({"x": (2, 3, 8)}, passes=False))
    try:
        want = unfused.run([x])[0]
    finally:
        unfused.release()
    got = net.run({"x": x})["y"]
    assert rel_l2(got, want) < 1e-6
    assert len(net._last.launches) == 4  # LayerNorm, Gelu, LayerNorm, Gelu+Relu


def test_layernorm_pattern_with_a_shared_intermediate_is_left_alone(ctx):
    nodes, inits = _transformer_norms()
    nodes = nodes[:9] + [helper.make_node("Add", ["ln1_d", "ln1"], ["y"])]  # x - mean read outside the pattern
    _, g = build(ctx, nodes, {"x": ("float32", [2, 3, 8])}, inits, passes=False)
    normalize_layers(g)  # (no LayerNorm; d / sqrt(mean(d^2) + eps) itself is an RMSNorm of d, which may form)
    assert not any(n.op == "LayerNorm" for n in g.nodes) and any(n.op == "Sub" for n in g.nodes)


@pytest.mark.parametrize("batch,copies", [(1, 0), (2, 3)])
def test_concat_inputs_written_in_place(ctx, batch, copies):
    # three producers concatenated on channels: at batch 1 each slice is contiguous, so each producer writes straight
    # into the Concat's buffer and the Concat itself costs no launch; at batch 2 the slices are strided: copies
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["x"], ["b"]),
             helper.make_node("Conv", ["x", "w2"], ["c"]),
             helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=1)]
    w1 = R.standard_normal((5, 3, 3, 3)).astype(np.float32)
    w2 = R.standard_normal((2, 3, 1, 1)).astype(np.float32)
    model = make_model(nodes, {"x": ("float32", [batch, 3, 6, 6])}, ["y"], {"w1": w1, "w2": w2})
    net = dlnet.Net(ctx).load_onnx(model)
    x = R.standard_normal((batch, 3, 6, 6)).astype(np.float32)
    from tests.conftest import reference
    assert rel_l2(net.run({"x": x})["y"], reference(model, {"x": x})[0]) < 1e-5
    assert sum(launch.label.startswith("copy into") for launch in net.launches) == copies


def test_chained_concats_share_one_buffer(ctx):
    """densenet's blocks: each Concat extends the one before, which a Relu also reads (the first one a Tanh's
    output, read twice too); at batch 1 every Concat is a prefix of the last one's buffer, so no launch copies, and
    the results match onnx.reference."""
    nodes, prev = [helper.make_node("Tanh", ["x"], ["t"])], "t"
    for i in range(3):
        nodes += [helper.make_node("Relu", [prev], [f"r{i}"]),
                  helper.make_node("Conv", [f"r{i}", f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Concat", [prev, f"c{i}"], [f"k{i}"], axis=1)]
        prev = f"k{i}"
    nodes.append(helper.make_node("Sigmoid", [prev], ["y"]))
    inits = {f"w{i}": R.standard_normal((2, 3 + 2 * i, 3, 3)).astype(np.float32) for i in range(3)}
    model = make_model(nodes, {"x": ("float32", [1, 3, 5, 5])}, ["y"], inits)
    net = dlnet.Net(ctx).load_onnx(model)
    x = R.standard_normal((1, 3, 5, 5)).astype(np.float32)
    from tests.conftest import reference
    assert rel_l2(net.run({"x": x})["y"], reference(model, {"x": x})[0]) < 1e-5
    assert not any(launch.label.startswith("copy into") for launch in net.launches)


def test_expand_read_by_pointwise_broadcasts_instead(ctx):
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"]), helper.make_node("Mul", ["e", "z"], ["m"]),
             helper.make_node("Expand", ["x", "shape"], ["f"]), helper.make_node("Relu", ["f"], ["r"]),
             helper.make_node("Add", ["m", "r"], ["y"])]
    inits = {"shape": np.array([2, 4, 3], np.int64)}
    inputs = {"x": ("float32", [2, 1, 3]), "z": ("float32", [2, 4, 3])}
    _, g = build(ctx, nodes, inputs, inits, passes=False)
    assert broadcast_expands(g)
    g.verify()
    # Mul broadcasts x itself; Relu of x would have x's shape, so that Expand stays
    assert body(g) == ["%4: f32[2,4,3] = Mul(%1, %2)",
                       "%5: f32[2,4,3] = Expand(%1) {shape=(2,4,3)}",
                       "%6: f32[2,4,3] = Relu(%5)",
                       "%7: f32[2,4,3] = Add(%4, %6)",
                       "return %7 \"y\""]
    assert not broadcast_expands(g)


def test_pointwise_read_only_by_a_reduce_runs_inside_it(ctx):
    nodes = [helper.make_node("Sub", ["x", "m"], ["d"]), helper.make_node("Mul", ["d", "d"], ["sq"]),
             helper.make_node("Mul", ["sq", "m"], ["w"]),
             helper.make_node("ReduceMean", ["w"], ["y"], axes=[0, 2], keepdims=1)]
    inputs = {"x": ("float32", [2, 3, 4]), "m": ("float32", [1, 3, 1])}
    _, g = build(ctx, nodes, inputs, {}, passes=False)
    fuse_pointwise(g)
    assert fuse_reduce_prologues(g)
    g.verify()
    # Mul reads d twice, both reads inside the group: Sub joins it, and the whole chain runs inside the reduction,
    # m broadcast there
    assert body(g) == ["%5: f32[1,3,1] = Reduce(%0, %1) {mode=mean, axes=(0,2), keepdims=1, prologue=[",
                       "%2: f32[2,3,4] = Sub(%0, %1)", "%3: f32[2,3,4] = Mul(%2, %2)", "%4: f32[2,3,4] = Mul(%3, %1)",
                       "]}", "return %5 \"y\""]
    x = R.standard_normal((2, 3, 4)).astype(np.float32)
    m = R.standard_normal((1, 3, 1)).astype(np.float32)
    plan = Plan(ctx, g)
    assert len(plan.launches) == 1
    assert rel_l2(plan.run([x, m])[0], ((x - m) ** 2 * m).mean(axis=(0, 2), keepdims=True)) < 1e-6
    plan.release()


def test_linear_on_a_sequence_is_one_product_with_bias_gelu_and_residual_epilogues(ctx):
    """MatMul [B, T, K] x [K, N] + bias, Gelu, MatMul + residual (an exported transformer MLP): two Gemms of B*T
    rows (not B products of T rows), bias and residual as their C, Gelu as the first one's epilogue."""
    K = 24
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["b1", "m1"], ["h"]),
             helper.make_node("Gelu", ["h"], ["g"]), helper.make_node("MatMul", ["g", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "x"], ["y"])]
    inits = {"w1": R.standard_normal((K, 40)).astype(np.float32), "b1": R.standard_normal((1, 1, 40)).astype(np.float32),
             "w2": R.standard_normal((40, K)).astype(np.float32)}
    for batch in (3, 5):
        net, g = build(ctx, nodes, {"x": ("float32", [batch, 7, K])}, inits, opset=20)
        gemms = [n for n in g.nodes if n.op == "Gemm"]
        assert [n.outputs[0].shape for n in gemms] == [(batch * 7, 40), (batch * 7, K)]
        assert [len(n.inputs) for n in gemms] == [3, 3] and gemms[0].attrs["act"][0] == "Gelu"
        assert not [n for n in g.nodes if n.op in ("Add", "Gelu", "Fused")]
        x = R.standard_normal((batch, 7, K)).astype(np.float32)
        h = x.astype(np.float64) @ inits["w1"] + inits["b1"]
        gelu = 0.5 * h * (1 + np.vectorize(__import__("math").erf)(h / np.sqrt(2)))
        assert rel_l2(net.run({"x": x})["y"], gelu @ inits["w2"] + x) < 1e-5


def test_transpose_of_single_axes_is_a_view(ctx):
    """[1, T, H, D] -> [1, H, T, D] at T = 1 (a decode step's heads) moves nothing: a Reshape, no launch; at T = 2 it
    stays a Transpose (read by the Relu's kernel through strides: passes/transposes.py)."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]), helper.make_node("Relu", ["t"], ["y"])]
    for t, transposes in ((1, 0), (2, 1)):
        net, g = build(ctx, nodes, {"x": ("float32", [1, t, 3, 4])}, {})
        ops = [n.op for n in g.nodes] + [m.op for n in g.nodes if n.op == "Fused" for m in n.attrs["nodes"]]
        assert ops.count("Transpose") == transposes and ops.count("Reshape") == 1 - transposes
        x = R.standard_normal((1, t, 3, 4)).astype(np.float32)
        assert rel_l2(net.run({"x": x})["y"], np.maximum(x.transpose(0, 2, 1, 3), 0)) < 1e-7


def test_weights_of_few_row_products_stored_for_gemv():
    """pretranspose_weights: a constant B [K, N] of a product of at most keep_rows rows is stored [N, K] (transB=1,
    gemv.cl streams it along k); of more rows, [K, N] (the GEMM cores)."""
    from dlnet.graph.passes.layout import pretranspose_weights
    w = R.standard_normal((6, 5)).astype(np.float32)
    for rows, trans in ((1, 1), (9, 0)):
        for start in (w, w.T.copy()):
            g = Graph()
            a = g.new_value("float32", (rows, 6))
            g.inputs.append(a)
            y = g.new_value("float32", (rows, 5))
            g.add_node(Node("Gemm", [a, g.constant(start)], [y], {"transB": int(start is not w)}))
            g.outputs.append(y)
            pretranspose_weights(g, keep_rows=8)
            node = g.nodes[0]
            assert node.attrs["transB"] == trans
            assert np.array_equal(node.inputs[1].const, w.T if trans else w)
