"""Pooling and LRN on shapes that cross the CPU kernels' edges (windows clipped at every border, ceil_mode rows past
the padded image, dilation, 1-D pooling, LRN pixel counts that leave a tail past the last 8-pixel block), against
NumPy in float64."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from tests.conftest import make_model, rel_l2

R = np.random.default_rng(3)


def pool_numpy(x, mode, k, s, p, d, out, count_include_pad):
    """x: (N, C, *sp) float64; p: symmetric pads per spatial dim; out: output spatial shape (ceil_mode decided)."""
    nsp = x.ndim - 2
    y = np.zeros(x.shape[:2] + tuple(out))
    for o in np.ndindex(*out):
        idx, n_pad = [], 1
        for i in range(nsp):
            taps = [o[i] * s[i] - p[i] + t * d[i] for t in range(k[i])]
            idx.append([t for t in taps if 0 <= t < x.shape[2 + i]])
            n_pad *= sum(1 for t in taps if t < x.shape[2 + i] + p[i])
        win = x[(slice(None), slice(None)) + np.ix_(*idx)].reshape(x.shape[:2] + (-1,))
        if mode == "max":
            y[(slice(None), slice(None)) + o] = win.max(axis=2)
        else:
            y[(slice(None), slice(None)) + o] = win.sum(axis=2) / (n_pad if count_include_pad else win.shape[2])
    return y


POOLS = [  # (op, input shape, kernel, strides, pads, dilations, ceil_mode, count_include_pad)
    ("MaxPool", (1, 4, 56, 56), [3, 3], [2, 2], [1, 1], [1, 1], 0, 0),      # resnet's stem pool
    ("MaxPool", (2, 3, 13, 17), [3, 3], [2, 2], [0, 0], [1, 1], 1, 0),      # squeezenet's: ceil_mode, no pads
    ("MaxPool", (1, 2, 11, 9), [2, 3], [1, 2], [1, 1], [2, 2], 0, 0),       # dilation
    ("AveragePool", (2, 3, 13, 17), [3, 3], [2, 2], [1, 1], [1, 1], 1, 1),  # count_include_pad with ceil_mode
    ("AveragePool", (2, 3, 13, 17), [3, 3], [2, 2], [1, 1], [1, 1], 0, 0),
    ("AveragePool", (1, 5, 7, 7), [7, 7], [1, 1], [0, 0], [1, 1], 0, 0),    # a global average
    ("MaxPool", (2, 3, 19), [4], [3], [2], [1], 1, 0),                      # 1-D
]


@pytest.mark.parametrize("case", POOLS, ids=[f"{c[0]}-{'x'.join(map(str, c[1]))}-{i}" for i, c in enumerate(POOLS)])
def test_pool_matches_numpy(ctx, case):
    op, shape, k, s, p, d, ceil, cip = case
    x = R.standard_normal(shape).astype(np.float32)
    attrs = dict(kernel_shape=k, strides=s, pads=p + p, ceil_mode=ceil)
    if d != [1] * len(k):
        attrs["dilations"] = d
    if op == "AveragePool":
        attrs["count_include_pad"] = cip
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, ["y"], opset=19)
    got = list(dlnet.Net(ctx).load_onnx(model).run({"x": x}).values())[0]
    rnd = np.ceil if ceil else np.floor
    out = [int(rnd((shape[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) / s[i])) + 1 for i in range(len(k))]
    out = [o - 1 if ceil and (o - 1) * s[i] >= shape[2 + i] + p[i] else o for i, o in enumerate(out)]
    want = pool_numpy(x.astype(np.float64), "max" if op == "MaxPool" else "avg", k, s, p, d, out, cip)
    assert got.shape == want.shape
    assert rel_l2(got, want) < 1e-6


@pytest.mark.parametrize("shape,size", [((2, 9, 5, 5), 5), ((1, 7, 3, 11), 4), ((1, 16, 8, 8), 3)])
def test_lrn_matches_numpy(ctx, shape, size):
    x = R.standard_normal(shape).astype(np.float32)
    alpha, beta, bias = 1e-2, 0.75, 2.0
    model = make_model([helper.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)],
                       {"x": x}, ["y"])
    got = list(dlnet.Net(ctx).load_onnx(model).run({"x": x}).values())[0]
    x64, sq = x.astype(np.float64), np.zeros(shape)
    for c in range(shape[1]):  # the window is c - floor((size-1)/2) .. c + ceil((size-1)/2)
        sq[:, c] = (x64[:, max(0, c - (size - 1) // 2):c + -(-(size - 1) // 2) + 1] ** 2).sum(axis=1)
    want = x64 / (bias + alpha / size * sq) ** beta
    assert rel_l2(got, want) < 1e-6


SEPARABLE = [  # MaxPool 3x3 stride 2 (pool_cpu.cl's pool_cpu_sep on CPUs): (input shape, pads, ceil_mode)
    ((1, 3, 40, 41), [1, 1], 0),    # interior vectors of 8 columns, then pool_row's last columns and edges
    ((2, 2, 23, 37), [0, 0], 1),    # ceil_mode: the last row's and column's windows clipped
    ((1, 2, 111, 111), [0, 0], 1),  # squeezenet's first pool: several work-items of rows per plane
    ((1, 2, 7, 5), [1, 1], 0),      # too narrow for a vector: pool_col alone
    ((1, 2, 9, 17), [0, 0], 0),     # one vector exactly, reading the rows' last column
    ((1, 2, 12, 20), [2, 2], 1),    # pads of 2: two columns and rows of each edge window outside the image
]


@pytest.mark.parametrize("separable", [False, True], ids=["taps", "separable"])
@pytest.mark.parametrize("case", SEPARABLE, ids=["x".join(map(str, c[0])) for c in SEPARABLE])
def test_maxpool_3x3_stride2_both_paths(ctx, case, separable):
    """Each input row's 3-wide maxima shared by the two output rows that read it, or every tap: the same maxima, a
    NaN in a window propagating to its outputs alone."""
    shape, p, ceil = case
    x = R.standard_normal(shape).astype(np.float32)
    x[0, 0, shape[2] // 2, shape[3] // 2 + 1] = np.nan
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=p + p,
                                         ceil_mode=ceil)], {"x": x}, ["y"], opset=19)
    net = dlnet.Net(ctx.with_options(pool_cpu_separable=separable)).load_onnx(model)
    got = list(net.run({"x": x}).values())[0]
    if ctx.is_cpu:
        assert ("pool_cpu_sep" in [launch.kernel.function_name for launch in net.launches]) == separable
    rnd = np.ceil if ceil else np.floor
    out = [int(rnd((shape[2 + i] + 2 * p[i] - 3) / 2)) + 1 for i in range(2)]
    out = [o - 1 if ceil and (o - 1) * 2 >= shape[2 + i] + p[i] else o for i, o in enumerate(out)]
    want = pool_numpy(x.astype(np.float64), "max", [3, 3], [2, 2], p, [1, 1], out, 0)
    assert got.shape == want.shape
    nan = np.isnan(want)
    assert 0 < nan.sum() <= 4 and np.array_equal(np.isnan(got), nan)
    assert rel_l2(got[~nan], want[~nan]) < 1e-6


@pytest.mark.parametrize("case", [((2, 3, 23, 37), [1, 1], 0), ((1, 4, 24, 40), [0, 0], 1),
                                  ((1, 3, 15, 21), [2, 2], 0)], ids=["pads1", "ceil", "pads2"])
def test_maxpool_3x3_stride2_nan_inf(ctx, case):
    """NaNs at every column parity and at the edges, and infinities: a NaN in a window gives NaN, whatever else is
    in it; the rest as NumPy's maxima (pool_cpu_sep keeps NaNs as a mask beside plain maxima)."""
    shape, p, ceil = case
    x = R.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    picks = R.choice(flat.size, size=flat.size // 40, replace=False)
    flat[picks[0::3]] = np.nan
    flat[picks[1::3]] = np.inf
    flat[picks[2::3]] = -np.inf
    x[0, 0, :, 0] = np.nan  # a left edge column and a bottom row
    x[-1, -1, -1, :] = -np.nan
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=p + p,
                                         ceil_mode=ceil)], {"x": x}, ["y"], opset=19)
    net = dlnet.Net(ctx).load_onnx(model)
    got = list(net.run({"x": x}).values())[0]
    if ctx.is_cpu:
        assert "pool_cpu_sep" in [launch.kernel.function_name for launch in net.launches]
    rnd = np.ceil if ceil else np.floor
    out = [int(rnd((shape[2 + i] + 2 * p[i] - 3) / 2)) + 1 for i in range(2)]
    out = [o - 1 if ceil and (o - 1) * 2 >= shape[2 + i] + p[i] else o for i, o in enumerate(out)]
    with np.errstate(invalid="ignore"):
        want = pool_numpy(x.astype(np.float64), "max", [3, 3], [2, 2], p, [1, 1], out, 0)
    assert got.shape == want.shape
    assert np.isnan(want).any() and np.isinf(want).any()
    np.testing.assert_array_equal(got, want.astype(np.float32))  # (NaN where NaN)
