"""Gemm shaped to cross the edges of the CPU kernel's tiling (rows past a 6-row tile, columns past a 16-column
panel, M = 1 fully connected layers), with transposes, alpha/beta, broadcast C and a fused activation, against
NumPy in float64. Constant B takes the packed path on CPU devices, B as an input the portable one."""
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


@pytest.mark.parametrize("b_as_input", [False, True], ids=["const-b", "input-b"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_gemm_matches_numpy(ctx, shape, b_as_input):
    M, K, N = shape
    for trans_a, trans_b, c_shape, relu in [(0, 1, (N,), True), (1, 0, (M, N), False), (0, 0, (1, 1), False)]:
        model, feeds, want = gemm_model(M, K, N, trans_a, trans_b, c_shape, b_as_input, relu)
        net = dlnet.Net(ctx).load_onnx(model)
        got = list(net.run(feeds).values())[0]
        assert got.shape == want.shape
        assert rel_l2(got, want) < 1e-5, (trans_a, trans_b, c_shape)
        net.release()
