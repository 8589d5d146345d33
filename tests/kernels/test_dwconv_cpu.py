"""Depthwise convolutions shaped to cross the CPU kernels' edges (rows shorter and longer than an 8-output block,
border outputs on both sides, strides 1 and 2, dilation, a depth multiplier, batch 2) with the fused bias +
residual + activation epilogue, against NumPy in float64."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from tests.conftest import make_model, rel_l2

R = np.random.default_rng(11)

SHAPES = [  # (batch, C, H, W, multiplier, kernel, stride, pad, dilation)
    (1, 3, 19, 21, 1, 3, 1, 1, 1),    # 21 outputs per row: two vector blocks between the borders, a scalar tail
    (2, 4, 14, 14, 1, 3, 2, 1, 1),    # stride 2, batch 2
    (1, 2, 9, 30, 2, 5, 1, 2, 1),     # 5x5, depth multiplier 2
    (1, 2, 11, 26, 1, 3, 2, 2, 2),    # dilation 2 with stride 2
    (1, 5, 6, 5, 1, 3, 1, 0, 1),      # rows too short for a vector block
]


def dwconv_numpy(x, w, b, s, p, d):
    n, c, h, wd = x.shape
    co, _, k, _ = w.shape
    m = co // c
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    oh, ow = (h + 2 * p - d * (k - 1) - 1) // s + 1, (wd + 2 * p - d * (k - 1) - 1) // s + 1
    y = np.zeros((n, co, oh, ow))
    for o in range(co):
        for ky in range(k):
            for kx in range(k):
                y[:, o] += w[o, 0, ky, kx] * xp[:, o // m, ky * d:ky * d + s * (oh - 1) + 1:s,
                                                kx * d:kx * d + s * (ow - 1) + 1:s]
    return y + b[None, :, None, None]


SHAPES += [
    (1, 6, 7, 7, 1, 3, 1, 1, 1),      # 7x7 planes (9 padded columns a row): vectors across rows
    (2, 3, 13, 12, 3, 3, 2, 1, 1),    # stride 2 over four phase planes, multiplier 3
    (1, 70, 5, 4, 1, 3, 1, 1, 1),     # small planes, several per work-item (and per pad_planes work-item)
    (1, 3, 10, 45, 1, 3, 1, 1, 1),    # 45 outputs a row: 6 vectors, in row blocks of 4 and 2 (the last repeated)
    (1, 4, 9, 16, 1, 3, 1, 1, 1),     # 16 a row: two whole vectors, blocks of 2 rows
    (1, 3, 12, 8, 1, 3, 1, 1, 1),     # 8 a row: one vector, blocks of 4 rows
    (1, 4, 23, 29, 1, 3, 2, 0, 1),    # stride 2 without pads: 14 a row (2 vectors, the second overlapping)
    (1, 3, 20, 19, 1, 3, 2, 2, 1),    # stride 2, pads 2: both column phases from one row, borders of 2
]
# over zero-padded planes, each work-item padding its own rows (Options.dw_cpu_pad_in) or after a pad_planes launch;
# or with borders (Options.dw_cpu_planes off)
# (pad_in: in row blocks (Options.dw_cpu_row_accs); pad_in_1: one vector at a time)
VARIANTS = ["pad_in", "pad_planes", "borders", "pad_in_1"]


def use_variant(ctx, variant, **changes):
    """ctx with the depthwise variant's options (and `changes`)."""
    return ctx.with_options(dw_cpu_planes=variant != "borders", dw_cpu_pad_in=variant.startswith("pad_in"),
                            dw_cpu_row_accs=0 if variant == "pad_in_1" else 4, **changes)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_depthwise_matches_numpy(ctx, shape, variant):
    check_depthwise(use_variant(ctx, variant), shape, variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_depthwise_several_rows_per_work_item(ctx, shape, variant):
    """Blocks of rows per work-item (rules.dw_rows), the last block of each plane ragged."""
    from dlnet.kernels import rules
    # three rows of the input's width
    ctx = use_variant(ctx, variant, dw_min_outputs=2 * shape[3] + 1, dw_min_items=1)
    n, c, h, w, m, k, s, p, d = shape
    oh, ow = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
    assert 1 < rules.dw_rows(oh, ow, n * c * m, ctx.options) or oh == 1  # (what the options are for)
    check_depthwise(ctx, shape, variant)


@pytest.mark.parametrize("variant", VARIANTS[:2])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_depthwise_several_planes_per_work_item(ctx, shape, variant):
    """Whole planes, several per work-item (and per pad_planes work-item), the last work-item's share ragged."""
    # about three output planes
    ctx = use_variant(ctx, variant, dw_min_outputs=3 * shape[2] * shape[3], dw_min_items=1, pad_min_items=1)
    check_depthwise(ctx, shape, variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("pads", [[0, 1, 2, 0], [2, 0, 0, 2], [0, 0, 1, 1]])
def test_depthwise_asymmetric_pads(ctx, pads, variant):
    """Pads that differ per side (TF's SAME padding), 3x3 and 4x4 kernels, against onnxruntime."""
    import onnxruntime as ort
    ctx = use_variant(ctx, variant)
    x = R.uniform(-1, 1, (2, 5, 10, 13)).astype(np.float32)
    for k in (3, 4):
        w = R.uniform(-1, 1, (5, 1, k, k)).astype(np.float32)
        model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=pads, group=5)], {"x": x}, ["y"],
                           {"w": w})
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        net = dlnet.Net(ctx).load_onnx(model)
        assert rel_l2(net.run({"x": x})["y"], want[0]) < 1e-6
        net.release()


def check_depthwise(ctx, shape, variant):
    n, c, h, wd, m, k, s, p, d = shape
    x = R.uniform(-1, 1, (n, c, h, wd)).astype(np.float32)
    w = R.uniform(-1, 1, (c * m, 1, k, k)).astype(np.float32)
    b = R.uniform(-1, 1, c * m).astype(np.float32)
    conv = dwconv_numpy(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), s, p, d)
    r = R.uniform(-1, 1, conv.shape).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4,
                              dilations=[d, d], group=c),
             helper.make_node("Add", ["c", "r"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    model = make_model(nodes, {"x": x, "r": r}, ["y"], {"w": w, "b": b})
    net = dlnet.Net(ctx).load_onnx(model)
    if ctx.is_cpu:
        kernels = [launch.kernel.function_name for launch in net.launches]
        assert ("dwconv2d_cpu" if variant == "borders" else "dwconv2d_cpu_planes") in kernels, kernels
        assert ("pad_planes" in kernels) == (variant == "pad_planes"), kernels
    got = list(net.run({"x": x, "r": r}).values())[0]
    want = np.maximum(conv + r, 0)
    assert got.shape == want.shape
    assert rel_l2(got, want) < 1e-6
