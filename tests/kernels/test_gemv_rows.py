"""gemv_rows.cl: fully connected layers of 9..32 rows (batch 9..32) with transB=1 weights on the GPU path (the GPU
table forced onto a CPU device, as test_gemm_cores.py's 'portable' case does), against float64 NumPy."""
import numpy as np
import pytest
from onnx import helper

import dlnet

from ..conftest import context, make_model, rel_l2

rng = np.random.default_rng(11)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture
def gpu_ctx():
    # the GPU's cores on a CPU device too: gemm_core.cl and the gemv kernels instead of gemm_vec.cl
    return context().with_options(matrix_core="portable")


def fc_model(a, w, c, alpha, beta, relu):
    """Gemm(a, w^T [, c]) [-> Relu]; and its float64 value."""
    inputs = ["a", "w"] + (["c"] if c is not None else [])
    nodes = [helper.make_node("Gemm", inputs, ["g" if relu else "y"], transB=1, alpha=alpha, beta=beta)]
    if relu:
        nodes.append(helper.make_node("Relu", ["g"], ["y"]))
    inits = {"w": w} if c is None else {"w": w, "c": c}
    ref = alpha * a.astype(np.float64) @ w.T.astype(np.float64)
    if c is not None:
        ref = ref + beta * c.astype(np.float64)
    return make_model(nodes, {"a": a}, ["y"], inits), np.maximum(ref, 0) if relu else ref


# (M, N, K, shape of C or None, Relu): N not a multiple of any config's column block (LN * NC), K a multiple of 4
# and not of any chunk (KC); C as a bias row, a full matrix and a column
CASES = [(9, 300, 1300, (300,), True), (16, 129, 1028, None, False), (32, 77, 1040, (32, 77), True),
         (12, 65, 2052, (12, 1), False)]


@pytest.mark.parametrize("splits", [1, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("m,n,k,c_shape,relu", CASES)
def test_gemv_rows(gpu_ctx, m, n, k, c_shape, relu, splits):
    """Bias (beta) in three broadcast shapes, alpha, a fused Relu; K in one slice (gemv_rows_splits=1) or split
    three ways (the partial sums summed by gemv_rows_reduce, which then applies the epilogue)."""
    check_fc(gpu_ctx, "gemv_rows", 1e-5, m, n, k, c_shape, relu, splits)


def check_fc(ctx, kernel, tol, m, n, k, c_shape, relu, splits):
    """Gemm(a, w^T, c) [-> Relu] on `kernel` alone, its K in `splits` slices, against float64 within `tol`, twice."""
    ctx = ctx.with_options(gemv_rows_splits=splits)
    a, w = f32(m, k), f32(n, k)
    c = f32(*c_shape) if c_shape else None
    model, ref = fc_model(a, w, c, 0.7, 1.3, relu)
    net = dlnet.Net(ctx).load_onnx(model)
    labels = [launch.label for launch in net.launches]
    assert labels and all(kernel in label for label in labels), labels  # the Relu too, in its epilogue
    assert any("splitK" in label for label in labels) == (splits > 1), labels
    assert any(f"splitK{splits}" in label for label in labels) or splits == 1, labels
    assert rel_l2(net.run({"a": a})["y"], ref) < tol
    a2 = f32(m, k)  # the same plan on fresh inputs
    assert rel_l2(net.run({"a": a2})["y"], fc_model(a2, w, c, 0.7, 1.3, relu)[1]) < tol


@pytest.mark.slow
@pytest.mark.parametrize("tiles", [dict(LK=8, LN=8, NC=4, KC=32, per_cu=1), dict(LK=16, LN=4, NC=1, KC=128, per_cu=4),
                                   dict(LK=8, LN=8, NC=4, KC=64, per_cu=1, pf=1)])
def test_gemv_rows_configs(gpu_ctx, tiles):
    """Other work-group shapes of the config table (as Options.gemv_rows_tiles sets them): one step per chunk and
    the lane sums in ten passes of two rows; 16 lanes along k, one column each; the next chunk of A read ahead
    (PREFETCH_A, a partial last chunk); slices picked by the model (split on a device of few compute units, like
    CI's PoCL)."""
    gpu_ctx = gpu_ctx.with_options(gemv_rows_tiles={32: tiles})
    a, w, c = f32(20, 1000), f32(75, 1000), f32(75)
    model, ref = fc_model(a, w, c, 1.0, 1.0, True)
    net = dlnet.Net(gpu_ctx).load_onnx(model)
    labels = [launch.label for launch in net.launches]
    assert any("gemv_rows" in label for label in labels), labels
    if gpu_ctx.info.compute_units <= 4:
        assert any("splitK" in label for label in labels), labels
    assert rel_l2(net.run({"a": a})["y"], ref) < 1e-5


@pytest.mark.parametrize("m,k", [(16, 1027), (33, 1028)])
def test_gemv_rows_not_taken(gpu_ctx, m, k):
    """A K that is not a multiple of 4, or more than Options.gemv_max_rows rows: the GEMM core."""
    gpu_ctx = gpu_ctx.with_options(gemv_max_rows=32)
    a, w, c = f32(m, k), f32(40, k), f32(40)
    model, ref = fc_model(a, w, c, 1.0, 1.0, False)
    net = dlnet.Net(gpu_ctx).load_onnx(model)
    assert not any("gemv" in launch.label for launch in net.launches), [x.label for x in net.launches]
    assert rel_l2(net.run({"a": a})["y"], ref) < 1e-5


@pytest.fixture
def tf32_ctx():
    ctx = context()
    if not ctx.is_nvidia:
        pytest.skip("gemv_mma.cl needs an NVIDIA device (inline PTX mma.sync)")
    return dlnet.Context(ctx.info, precision="tf32", options=ctx.options)


# (M, N, K, shape of C or None, Relu): one and two m-tiles, rows past M in both; N not a multiple of a work-group's
# columns (64); K a multiple of 4 and not of 32 (the last step of B clamped)
MMA_CASES = [(9, 300, 1300, (300,), True), (16, 129, 1028, None, False), (17, 77, 2052, (17, 77), True),
             (32, 1000, 4100, (32, 1), False)]


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("m,n,k,c_shape,relu", MMA_CASES)
def test_gemv_mma(tf32_ctx, m, n, k, c_shape, relu, splits):
    """tf32 mode on NVIDIA: gemv_mma.cl (tensor cores) in place of gemv_rows.cl, the error that of tf32 inputs; K in
    one slice or three (gemv_rows_reduce applying the epilogue)."""
    check_fc(tf32_ctx, "gemv_mma", 2e-3, m, n, k, c_shape, relu, splits)


@pytest.mark.parametrize("tiles", [{"WARPS": 4, "NBW": 2, "KC": 64, "per_cu": 2},
                                   {"WARPS": 2, "NBW": 4, "KC": 64, "per_cu": 4},
                                   {"WARPS": 8, "NBW": 1, "KC": 32, "per_cu": 1}])
def test_gemv_mma_configs(tf32_ctx, tiles):
    """Other work-group shapes (as Options.gemv_mma sets them), slices picked by the rule."""
    tf32_ctx = tf32_ctx.with_options(gemv_mma=tiles)
    a, w, c = f32(20, 3000), f32(275, 3000), f32(275)
    model, ref = fc_model(a, w, c, 1.0, 1.0, True)
    net = dlnet.Net(tf32_ctx).load_onnx(model)
    assert any("gemv_mma" in launch.label for launch in net.launches), [x.label for x in net.launches]
    assert rel_l2(net.run({"a": a})["y"], ref) < 2e-3
