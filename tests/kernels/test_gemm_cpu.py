"""Gemm shaped to cross the edges of the CPU kernel's tiling (rows past a 6-row tile, columns past a 16-column
panel, M = 1 fully connected layers), with transposes, alpha/beta, broadcast C and a fused activation, against
NumPy in float64. On CPU devices a constant B is packed at lowering, B as an input by gemm_cpu_pack before each run
(with Options.gemm_cpu_pack off it takes the portable gemm_vec.cl)."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from tests.conftest import make_model, rel_l2

R = np.random.default_rng(7)

SHAPES = [  # (M, K, N)
    (1, 300, 100),   # a batch-1 fully connected layer: MR = 1, a ragged last panel (100 = 6 * 16 + 4)
    (1, 9, 16),      # exactly one panel
    (5, 33, 17),     # MR = 5, one column past a panel
    (7, 64, 48),     # one row past a 6-row tile
    (13, 20, 1),     # a single output column
    (20, 37, 40),    # transA: A packed in panels of 6 rows (gemm_cpu_pack on A^T), the last 2 rows past M zero
]


def gemm_model(M, K, N, trans_a, trans_b, c_shape, b_as_input, relu):
    a = R.uniform(-1, 1, (K, M) if trans_a else (M, K)).astype(np.float32)
    b = R.uniform(-1, 1, (N, K) if trans_b else (K, N)).astype(np.float32)
    c = R.uniform(-1, 1, c_shape).astype(np.float32)
    alpha, beta = 0.7, -1.3
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["g"], transA=trans_a, transB=trans_b, alpha=alpha,
                              beta=beta)]
    nodes.append(helper.make_node("Relu" if relu else "Identity", ["g"], ["y"]))
    feeds, inits = {"a": a}, {"c": c}
    (feeds if b_as_input else inits)["b"] = b
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = alpha * ((a64.T if trans_a else a64) @ (b64.T if trans_b else b64)) + beta * c.astype(np.float64)
    return make_model(nodes, feeds, ["y"], inits), feeds, np.maximum(want, 0) if relu else want


@pytest.mark.parametrize("b_as_input,pack", [(False, True), (True, True), (True, False)],
                         ids=["const-b", "input-b", "input-b-portable"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_gemm_matches_numpy(ctx, shape, b_as_input, pack):
    M, K, N = shape
    for trans_a, trans_b, c_shape, relu in [(0, 1, (N,), True), (1, 0, (M, N), False), (0, 0, (1, 1), False)]:
        model, feeds, want = gemm_model(M, K, N, trans_a, trans_b, c_shape, b_as_input, relu)
        net = dlnet.Net(ctx.with_options(gemm_cpu_pack=pack)).load_onnx(model)
        if ctx.dev.is_cpu and not ctx.dev.tiled and M > 1:  # (M = 1: a GEMV, not a GEMM)
            schedule = next(n for n in net.graph.nodes if n.op == "Gemm").schedule
            assert schedule["algo"] == ("gemm_cpu" if pack else "gemm"), schedule
            if pack:  # (A read along its columns by several panels of 16: packed)
                assert schedule["tile"].endswith("/pa") == (trans_a and M > 6 and N > 16), schedule
        got = list(net.run(feeds).values())[0]
        assert got.shape == want.shape
        assert rel_l2(got, want) < 1e-5, (trans_a, trans_b, c_shape)
        net.release()


@pytest.mark.parametrize("a_shape", [(2, 5, 33), (2, 3, 7, 20), (1, 128, 96)], ids=["3d", "4d", "tokens"])
def test_matmul_of_many_rows_takes_the_packed_path(ctx, a_shape):
    """A MatMul of an A of rank > 2 by a constant 2-D B (a transformer's linear layer) is one packed product of all
    of A's rows on CPU devices (gemm_cpu, rows of several batches in one tile), with a fused Relu."""
    K, N = a_shape[-1], 37
    a = R.standard_normal(a_shape).astype(np.float32)
    b = R.standard_normal((K, N)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    net = dlnet.Net(ctx).load_onnx(make_model(nodes, {"a": a}, ["y"], {"b": b}))
    got = net.run({"a": a})["y"]
    gemm = [n for n in net.graph.nodes if n.op == "Gemm"]
    if ctx.dev.is_cpu and not ctx.dev.tiled:
        assert [n.schedule["algo"] for n in gemm] == ["gemm_cpu"]
    assert rel_l2(got, np.maximum(a.astype(np.float64) @ b, 0)) < 1e-5
    net.release()


def test_gemm_rows_flattens_only_where_c_does():
    """gemm_rows (the rows flatten_gemm_rows makes one product of): C broadcast along all rows or laid out like y flattens; C varying per batch but repeated
    along rows does not, nor a transposed A of rank > 2."""
    from dlnet.graph.ir import Builder, Graph
    from dlnet.graph.passes.layout import gemm_rows

    def node(a_shape, c_shape, trans_a=0):
        g = Graph("t")
        a = g.add_input("a", "float32", a_shape)
        ins = [a, Builder(g).const(np.ones((a_shape[-2] if trans_a else a_shape[-1], 4), np.float32))]
        if c_shape is not None:
            ins.append(g.add_input("c", "float32", c_shape))
        return Builder(g).op("Gemm", ins, {"transA": trans_a}).producer

    assert gemm_rows(node((2, 3, 5), None)) == (6, 0, 0)
    assert gemm_rows(node((2, 3, 5), (4,))) == (6, 0, 1)
    assert gemm_rows(node((2, 3, 5), (2, 3, 4))) == (6, 4, 1)
    assert gemm_rows(node((2, 3, 5), (3, 4))) is None  # per row, repeated for each batch
    assert gemm_rows(node((2, 3, 5), (2, 1, 4))) is None  # per batch, repeated along rows
    assert gemm_rows(node((1, 3, 5), (3, 4))) == (3, 4, 1)  # (a batch of one)
    assert gemm_rows(node((7, 1, 5), (4,))) == (7, 0, 1)  # rows of one (torch's sequence-first MHA at batch 1)
    assert gemm_rows(node((7, 1, 5), (7, 1, 4))) == (7, 4, 1)
    assert gemm_rows(node((7, 2, 1, 5), (7, 1, 1, 4))) is None
    assert gemm_rows(node((2, 5, 3), None, trans_a=1)) is None
