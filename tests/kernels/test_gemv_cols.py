"""gemv_cols.cl: products whose B is a [K, N] tensor stored by rows on the GPU path (the GPU table forced onto a CPU
device, as test_gemv_rows.py does): gemv_cols for few rows (a fully connected layer's dX = dy W at a small batch),
gemm_outer for a short K (its dW = dy^T x); against float64 NumPy."""
import numpy as np
import pytest
from onnx import helper

import dlnet

from ..conftest import context, make_model, rel_l2
from ..graph.test_autodiff import device_gradients

rng = np.random.default_rng(23)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture
def gpu_ctx():
    return context().with_options(matrix_core="portable")


def product(ctx, m, n, k, trans_a, c_shape, relu, alpha=0.7, beta=1.3):
    """Gemm(A, B [, C]) [-> Relu] with B [K, N] a graph input (not a weight: no transpose at load), and A [M, K] or
    [K, M] (transA); (net, its launches' labels, y, float64 y)."""
    a = f32(k, m) if trans_a else f32(m, k)
    b, c = f32(k, n), f32(*c_shape) if c_shape else None
    inputs = ["a", "b"] + (["c"] if c is not None else [])
    nodes = [helper.make_node("Gemm", inputs, ["g" if relu else "y"], transA=trans_a, alpha=alpha, beta=beta)]
    if relu:
        nodes.append(helper.make_node("Relu", ["g"], ["y"]))
    model = make_model(nodes, {"a": a, "b": b}, ["y"], {} if c is None else {"c": c})
    ref = alpha * (a.T if trans_a else a).astype(np.float64) @ b.astype(np.float64)
    if c is not None:
        ref = ref + beta * c.astype(np.float64)
    net = dlnet.Net(ctx).load_onnx(model)
    y = net.run({"a": a, "b": b})["y"]
    return net, [launch.label for launch in net.launches], y, np.maximum(ref, 0) if relu else ref


# (M, N, K, transA, C, Relu): N a multiple of 4 and not of a work-group's 128 columns; K not of a chunk's 64 rows
COLS = [(16, 300, 1000, 0, (300,), True), (5, 132, 77, 0, None, False), (32, 68, 515, 1, (32, 68), False),
        (9, 4, 130, 1, (9, 1), True)]


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("m,n,k,ta,c_shape,relu", COLS)
def test_gemv_cols(gpu_ctx, m, n, k, ta, c_shape, relu, splits):
    """Few rows (32 too, past the default Options.gemv_cols_max_rows): bias in three broadcast shapes, alpha and
    beta, a fused Relu, A transposed or not; K in one slice or three (the partial sums added by gemv_rows_reduce,
    which applies the epilogue)."""
    ctx = gpu_ctx.with_options(gemv_rows_splits=splits, outer_max_k=0, gemv_cols_max_rows=32)
    net, labels, y, ref = product(ctx, m, n, k, ta, c_shape, relu)
    assert labels and all("gemv_cols" in label for label in labels), labels
    assert any("splitK" in label for label in labels) == (splits > 1 and k > 64), labels
    assert rel_l2(y, ref) < 1e-5
    assert "algo=gemv_cols" in str(net.graph)  # (the IR prints the algorithm)


# (M, N, K, transA, C, Relu): M not a multiple of a work-item's 8 rows, N not of a work-group's 256 columns
OUTER = [(100, 260, 16, 1, (260,), True), (37, 36, 1, 0, None, False), (300, 516, 32, 1, (300, 1), False)]


@pytest.mark.parametrize("m,n,k,ta,c_shape,relu", OUTER)
def test_gemm_outer(gpu_ctx, m, n, k, ta, c_shape, relu):
    """A short K: bias, alpha and beta, a fused Relu, A transposed (a weight gradient's dy^T) or not."""
    net, labels, y, ref = product(gpu_ctx, m, n, k, ta, c_shape, relu)
    assert labels and all("outer" in label for label in labels), labels
    assert rel_l2(y, ref) < 1e-5
    assert "algo=gemm_outer" in str(net.graph)


@pytest.mark.parametrize("m,n,k", [(16, 30, 100), (64, 30, 8), (40, 64, 33), (17, 64, 100)])
def test_not_taken(gpu_ctx, m, n, k):
    """N not a multiple of 4 (no float4 rows of B), or more rows and K than either takes: the GEMM core."""
    net, labels, y, ref = product(gpu_ctx, m, n, k, 0, None, False)
    assert not any("gemv" in label or "outer" in label for label in labels), labels
    assert rel_l2(y, ref) < 1e-5


def test_linear_layer_gradients(gpu_ctx):
    """A fully connected layer at batch 16 (Gemm transB=1 with a bias): its dX runs on gemv_cols and its dW on
    gemm_outer; both against float64."""
    x, w, bias = f32(16, 200), f32(36, 200), f32(36)
    dy = rng.standard_normal((16, 36))
    loss, (dx, dw, db) = device_gradients("Gemm", {"transB": 1}, [x, w, bias], dy, fed_weights=True, ctx=gpu_ctx)
    assert abs(loss - float(((x.astype(np.float64) @ w.T + bias) * dy).sum())) < 1e-3 * abs(loss) + 1e-3
    assert rel_l2(dx, dy @ w.astype(np.float64)) < 1e-5
    assert rel_l2(dw, dy.T @ x.astype(np.float64)) < 1e-5
    assert rel_l2(db, dy.sum(0)) < 1e-5
