"""layout.slices_as_views: a Slice or Gather whose result is one contiguous range of its input becomes a SliceView (no
launch, no copy), and the run still matches onnx's reference evaluator; cuts that are not contiguous stay copies."""
import numpy as np
import onnx.reference
import pytest
from onnx import TensorProto, helper, numpy_helper

import dlnet
from dlnet.graph.passes.layout import slice_view_offset

from ..conftest import context, rel_l2


def packed_qkv_model(shape, perm):
    """ViT's unpacking of its in-projection: a Transpose, then q, k, v = t[0], t[1], t[2] (Gather on axis 0), then
    a Slice of k (rows 1.. of its first axis), combined elementwise."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm)]
    nodes += [helper.make_node("Gather", ["t", f"i{i}"], [n], axis=0) for i, n in enumerate("qkv")]
    nodes += [helper.make_node("Slice", ["k", "s0", "s1", "ax"], ["ks"]),
              helper.make_node("Slice", ["q", "s0", "s1", "ax"], ["qs"]),
              helper.make_node("Mul", ["qs", "ks"], ["qk"]),
              helper.make_node("Concat", ["qk", "qk"], ["c"], axis=0),
              helper.make_node("Add", ["q", "v"], ["y0"]),
              helper.make_node("Gather", ["v", "i1"], ["y2"], axis=1)]
    inits = [numpy_helper.from_array(np.array(i, np.int64), f"i{i}") for i in range(3)]
    inits += [numpy_helper.from_array(np.array(v, np.int64), n) for v, n in (([1], "s0"), ([9], "s1"), ([0], "ax"))]
    g = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y0", "c", "y2")], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("shape,perm,views,gathers", [
    ((9, 4, 3, 64), (2, 0, 1, 3), 5, 1),  # q, k, v and the two row Slices: views; the Gather on axis 1 is not
    ((9, 4, 3, 5), (2, 0, 1, 3), 1, 3),  # 180-float planes: only q (offset 0) keeps the arena's 256-byte alignment
])
def test_contiguous_cuts_are_views(shape, perm, views, gathers):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    model = packed_qkv_model(shape, perm)
    net = dlnet.Net(context()).load_onnx(model)
    out = net.run({"x": x})
    ref = onnx.reference.ReferenceEvaluator(model).run(None, {"x": x})
    for name, r in zip(("y0", "c", "y2"), ref):
        assert rel_l2(out[name], r) < 1e-6, name
    ops = [n.op for n in net.graph.nodes]
    assert ops.count("SliceView") == views
    assert ops.count("Gather") == gathers  # v[:, 1] is a strided cut


def test_slice_view_offset_rule():
    from dlnet.graph.ir import Builder, Graph
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", "float32", (1, 6, 4, 8))

    def offset(op, attrs, idx=None):
        y = b.op(op, [x] + ([g.constant(np.array(idx, np.int64))] if idx is not None else []), attrs)
        return slice_view_offset(y.producer)

    assert offset("Slice", {"starts": (0, 2, 0, 0), "counts": (1, 3, 4, 8), "steps": (1, 1, 1, 1)}) == 64
    assert offset("Slice", {"starts": (0, 0, 1, 0), "counts": (1, 6, 2, 8), "steps": (1, 1, 1, 1)}) is None
    assert offset("Slice", {"starts": (0, 1, 0, 0), "counts": (1, 2, 4, 8), "steps": (1, 2, 1, 1)}) is None
    assert offset("Gather", {"axis": 1}, -1) == 5 * 32
    assert offset("Gather", {"axis": 2}, 1) is None
