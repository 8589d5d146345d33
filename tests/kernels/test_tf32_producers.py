"""precision "tf32" on Hopper: a value that tf32 products alone read as their A is stored rounded to tf32 by the
kernel that makes it (schedule.tf32_producers: its node's tf32_y, the products' tf32_a), so gemm_wgmma.cl rounds
neither operand in shared memory."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.graph.ir import Builder, Graph
from dlnet.kernels.schedule import tf32_producers

from ..conftest import context, make_model, rel_l2

rng = np.random.default_rng(11)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_marks_values_that_products_alone_read():
    """The pass on any machine: a LayerNorm read by a product through a Reshape, and a product read by a product,
    store rounded; a value another op reads too, or a graph output, does not; a product reading it as B is not
    a reader it serves."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", "float32", (4, 16, 32))
    ln = b.op("LayerNorm", [x, g.constant(f32(32)), g.constant(f32(32))], {"axis": -1})
    flat = b.op("Reshape", [ln], {"shape": [64, 32]})
    h = b.op("Gemm", [flat, g.constant(f32(48, 32))], {"transB": 1})  # (read by a product alone: rounded)
    y = b.op("Gemm", [h, g.constant(f32(16, 48))], {"transB": 1})  # (a graph output)
    x2 = g.add_input("x2", "float32", (64, 32))
    ln2 = b.op("LayerNorm", [x2, g.constant(f32(32)), g.constant(f32(32))], {"axis": -1})
    other = b.op("Gemm", [ln2, g.constant(f32(16, 32))], {"transB": 1})
    s = b.op("Add", [ln2, g.constant(f32(32))], {})  # (ln2 read by an Add too: kept exact)
    g.outputs = [y, other, s]
    for node in g.nodes:
        if node.op == "Gemm":
            node.schedule["algo"] = "gemm"
    tf32_producers(g, lambda node: node.op == "Gemm")
    assert ln.producer.schedule == {"tf32_y": 1}
    assert h.producer.schedule == {"algo": "gemm", "tf32_y": 1, "tf32_a": 1}
    assert y.producer.schedule == {"algo": "gemm", "tf32_a": 1}  # (y itself is an output: not rounded)
    assert "tf32_y" not in ln2.producer.schedule and other.producer.schedule == {"algo": "gemm"}
    # a product reading the value as B does not count as a reader it serves
    g2 = Graph()
    b2 = Builder(g2)
    a = g2.add_input("a", "float32", (64, 32))
    ln3 = b2.op("LayerNorm", [a, g2.constant(f32(32)), g2.constant(f32(32))], {"axis": -1})
    z = b2.op("Gemm", [g2.constant(f32(64, 64)), ln3], {})
    g2.outputs = [z]
    z.producer.schedule["algo"] = "gemm"
    tf32_producers(g2, lambda node: node.op == "Gemm")
    assert "tf32_y" not in ln3.producer.schedule and "tf32_a" not in z.producer.schedule


def _block(ctx, M, D, F, **options):
    """LayerNorm -> MatMul -> Relu -> MatMul + the block's input, in tf32 with `options`: (net, y, float64 ref)."""
    ctx = dlnet.Context(ctx.info, precision="tf32", options=ctx.options.replace(**options))
    r = np.random.default_rng(M + D + F)
    x, w1, w2 = (r.standard_normal(s).astype(np.float32) for s in ((M, D), (D, F), (F, D)))
    scale, bias = r.standard_normal(D).astype(np.float32), r.standard_normal(D).astype(np.float32)
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["o"]), helper.make_node("Add", ["o", "x"], ["y"])]
    net = dlnet.Net(ctx).load_onnx(make_model(nodes, {"x": x}, ["y"], {"w1": w1, "w2": w2, "scale": scale,
                                                                        "bias": bias}, opset=17))
    x64 = x.astype(np.float64)
    n = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * scale + bias
    ref = np.maximum(n @ w1, 0) @ w2 + x64
    return net, net.run({"x": x})["y"], ref


@pytest.mark.parametrize("M,D,F", [(512, 256, 512), (300, 192, 264)])
def test_block_on_wgmma_reads_rounded_producers(M, D, F):
    """On Hopper: the LayerNorm and the first product store their y rounded, both products read A as it is; the
    result matches float64 at tf32's error and the same block with the pass off (which rounds A in shared memory:
    the same operands) to float accuracy."""
    ctx = context()
    if not ctx.is_nvidia or not dlnet.Context(ctx.info, precision="tf32").dev.wgmma:
        pytest.skip("gemm_wgmma.cl needs an NVIDIA Hopper GPU")
    net, y, ref = _block(ctx, M, D, F)
    ir = str(net.graph)
    assert ir.count("tf32_y=1") == 2 and ir.count("tf32_a=1") == 2, ir
    assert rel_l2(y, ref) < 7e-4
    off, y_off, _ = _block(ctx, M, D, F, tf32_producers=False)
    assert "tf32_y" not in str(off.graph)
    assert rel_l2(y, y_off) < 1e-6
