"""Convolutions shaped to cross every edge of the matrix kernels' tiling (ragged rows and columns, panels that
straddle two images, groups, 1x1 panels packed as vectors, weights as constants and as inputs) with the
fused bias + residual + activation epilogue, against onnxruntime."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from tests.conftest import make_model, rel_l2

R = np.random.default_rng(1)

SHAPES = [  # (batch, Cin, H, W, Cout, kernel, stride, pad, group)
    (1, 64, 56, 56, 64, 1, 1, 0, 1),     # 1x1 on one image: 3136 columns = 196 panels of 16, each a vector copy
    (1, 32, 7, 7, 70, 1, 1, 0, 1),       # 49 columns: a ragged last panel (packed by element); 70 rows: ragged
    (2, 16, 8, 8, 24, 1, 1, 0, 1),       # 1x1, batch 2: whole panels of the second image (its offset)
    (1, 16, 9, 11, 13, 3, 1, 1, 1),      # 99 columns, 13 rows
    (2, 8, 7, 7, 20, 3, 2, 1, 1),        # batch 2: a panel holds the end of image 0 and the start of image 1
    (3, 12, 5, 6, 18, 1, 1, 0, 3),       # 1x1 with batch 3 and 3 groups: panels across images
    (1, 12, 10, 10, 24, 3, 1, 1, 2),     # groups with 3x3
    (1, 24, 14, 14, 48, 1, 1, 0, 2),     # 1x1 with groups, 196 columns: packed
    (1, 24, 8, 8, 42, 1, 1, 0, 2),       # 1x1 with groups, 64 columns = 4 whole panels
    (1, 3, 33, 33, 16, 7, 2, 3, 1),      # a stem: KK = 147
    (1, 5, 38, 45, 12, 3, 2, 1, 1),      # stride 2, 23 columns a row: strided vector gathers, then a tail
    (1, 16, 30, 30, 20, 1, 2, 0, 1),     # 1x1 stride 2 (a downsampling shortcut): im2col, not the 1x1 panels
]


def conv_model(n, cin, h, w, cout, k, s, p, g, weights_as_input, act="Relu"):
    x = R.uniform(-1, 1, (n, cin, h, w)).astype(np.float32)
    wt = R.uniform(-1, 1, (cout, cin // g, k, k)).astype(np.float32)
    b = R.uniform(-1, 1, cout).astype(np.float32)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    r = R.uniform(-1, 1, (n, cout, oh, ow)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s],
                              pads=[p] * 4, group=g),
             helper.make_node("Add", ["c", "r"], ["a"]),
             helper.make_node(act, ["a"], ["y"])]
    feeds = {"x": x, "r": r}
    inits = {"b": b}
    if weights_as_input:
        feeds["w"] = wt
    else:
        inits["w"] = wt
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.parametrize("weights_as_input", [False, True], ids=["const-w", "input-w"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_conv_epilogue_matches_onnxruntime(ctx, shape, weights_as_input):
    import onnxruntime as ort
    model, feeds = conv_model(*shape, weights_as_input)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    net = dlnet.Net(ctx).load_onnx(model)
    if ctx.is_cpu and shape[5:8] == (1, 1, 0):  # 1x1 stride 1: packed per panel, vectors where it lies in one image
        assert "conv2d_cpu_local" in [launch.kernel.function_name for launch in net.launches]
    got = list(net.run(feeds).values())[0]
    assert got.shape == want.shape
    assert rel_l2(got, want) < 1e-5
    net.release()


@pytest.mark.parametrize("path", ["local", "im2col"])
@pytest.mark.parametrize("weights_as_input", [False, True], ids=["const-w", "input-w"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_conv_packed_panels_match_onnxruntime(ctx, shape, weights_as_input, path):
    """The same shapes on CPU devices' packed paths, the direct one off: every panel packed into __local memory by
    its work-item ("local"), or the whole im2col matrix by a pass of its own where the layer is not 1x1 ("im2col")."""
    import onnxruntime as ort
    ctx = ctx.with_options(conv_cpu_direct=False, conv_cpu_local_min_bytes=0 if path == "local" else 1 << 60)
    model, feeds = conv_model(*shape, weights_as_input)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    net = dlnet.Net(ctx).load_onnx(model)
    if ctx.is_cpu and shape[5] > 1:
        names = [launch.kernel.function_name for launch in net.launches]
        assert ("conv2d_cpu_local" if path == "local" else "im2col_pack") in names
    got = list(net.run(feeds).values())[0]
    assert rel_l2(got, want) < 1e-5
    net.release()


def test_conv_sigmoid_epilogue(ctx):
    import onnxruntime as ort
    model, feeds = conv_model(2, 8, 7, 7, 20, 3, 1, 1, 1, False, act="Sigmoid")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = list(dlnet.Net(ctx).load_onnx(model).run(feeds).values())[0]
    assert rel_l2(got, want) < 1e-5


PIXELS = [  # (batch, Cin, H, W, Cout, kernel, stride, pad, group): few pixels, whole 16-channel panels
    (1, 24, 7, 7, 128, 3, 1, 1, 1),      # 49 pixels in blocks of 5: a ragged last block; borders read as zeros
    (2, 8, 4, 4, 128, 3, 1, 1, 1),       # batch 2, 32 pixels in blocks of 5: a block holds both images' pixels
    (1, 32, 8, 8, 256, 1, 2, 0, 2),      # 1x1 stride 2 (resnet50's shortcut), 2 groups of 128 channels
    (1, 12, 9, 9, 144, 3, 2, 1, 1),      # stride 2 with pads: 25 pixels, 9 panels of channels
    (1, 40, 6, 6, 512, 1, 1, 0, 1),      # 1x1 stride 1 over 36 pixels in blocks of 6
    (1, 16, 5, 5, 1000, 1, 1, 0, 1),     # 1000 channels: the last panel's 8 past K are zero weights, not stored
]


@pytest.mark.parametrize("pixels,packed", [(False, False), (True, False), (True, True)],
                         ids=["panels", "pixels", "pixels-packed"])
@pytest.mark.parametrize("shape", PIXELS, ids=["x".join(map(str, s)) for s in PIXELS])
def test_conv_pixel_rows_match_onnxruntime(ctx, shape, pixels, packed):
    """Small maps on CPU devices: pixels as rows and output channels as 16-column panels (cpu_pixels, packed from x
    with its borders as zeros: per work-item, or all at once with the weights stationary), or the pixel panels of
    the other paths, with the fused epilogue."""
    import onnxruntime as ort
    ctx = ctx.with_options(conv_cpu_pixels_max=64 if pixels else 0, conv_cpu_pixels_packed=packed)
    model, feeds = conv_model(*shape, False)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    net = dlnet.Net(ctx).load_onnx(model)
    if ctx.is_cpu:
        node = next(n for n in net.graph.nodes if n.op == "Conv")
        assert (node.schedule["algo"] == "cpu_pixels") == pixels
        if pixels:
            assert "algo=cpu_pixels tile=" in str(net.graph)
            assert not any(launch.label.endswith(" pad") for launch in net.launches)
            assert any(launch.label.endswith(" pack") for launch in net.launches) == packed
    got = list(net.run(feeds).values())[0]
    assert rel_l2(got, want) < 1e-5
    net.release()


def test_pixel_rows_rule():
    """rules.pick_conv_cpu_pixels: the rows that pad the pixels least (49: 5, 36: 6); None past the pixel limit, for
    channels that whole 16-column panels would pad by more than 2%, or too few (fewer for 1x1 stride-1 layers), or
    for a panel over local memory."""
    from dlnet.kernels.rules import pick_conv_cpu_pixels
    assert pick_conv_cpu_pixels(49, 512, 4608, False, 64, 1 << 20) == 5
    assert pick_conv_cpu_pixels(36, 2048, 512, True, 64, 1 << 20) == 6
    assert pick_conv_cpu_pixels(49, 128, 1152, False, 64, 1 << 20) == 5
    assert pick_conv_cpu_pixels(49, 112, 1152, False, 64, 1 << 20) is None
    assert pick_conv_cpu_pixels(49, 384, 832, True, 64, 1 << 20) is None
    assert pick_conv_cpu_pixels(100, 512, 4608, False, 64, 1 << 20) is None
    assert pick_conv_cpu_pixels(49, 200, 4608, False, 64, 1 << 20) is None  # 208 panel columns: 4% padded
    assert pick_conv_cpu_pixels(169, 1000, 512, True, 196, 1 << 20) == 5  # 1008: 0.8% padded
    assert pick_conv_cpu_pixels(49, 512, 4608, False, 64, 4 * 4608 * 5 - 4) is None


DIRECT = [  # (batch, Cin, H, W, Cout, (kh, kw), pads [t, l, b, r], dilation, group, stride)
    (1, 16, 9, 11, 13, (3, 3), [1, 1, 1, 1], 1, 1, 1),    # 11 + 2 = 13 padded columns a row: panels across rows
    (2, 8, 13, 13, 20, (3, 3), [1, 1, 1, 1], 1, 2, 1),    # batch 2 with groups: each image's panels, 12x8 tiles
    (1, 6, 12, 10, 9, (3, 3), [0, 2, 1, 0], 1, 1, 1),     # asymmetric (TF-style) pads
    (1, 5, 16, 17, 7, (3, 3), [2, 2, 2, 2], 2, 1, 1),     # dilation 2
    (1, 4, 20, 20, 30, (5, 5), [2, 2, 2, 2], 1, 1, 1),    # 5x5
    (1, 9, 8, 21, 14, (1, 3), [0, 1, 0, 1], 1, 1, 1),     # 1x3: one tap row
    (1, 7, 3, 3, 5, (3, 3), [0, 0, 0, 0], 1, 1, 1),       # one output pixel
    (1, 3, 2, 40, 4, (3, 3), [1, 1, 1, 1], 1, 1, 1),      # wider than tall
    (2, 6, 15, 14, 10, (3, 3), [1, 1, 1, 1], 1, 1, 2),    # stride 2: four phase planes, odd and even sides
    (1, 3, 33, 31, 16, (7, 7), [3, 3, 3, 3], 1, 1, 2),    # a 7x7 stride-2 stem
    (1, 3, 35, 35, 12, (11, 11), [2, 2, 2, 2], 1, 1, 4),  # alexnet's 11x11 stride 4: sixteen phases
    (1, 5, 17, 16, 8, (3, 3), [2, 1, 2, 1], 2, 1, 2),     # dilation 2 with stride 2: every tap on phase 0
    (1, 4, 16, 18, 6, (2, 2), [1, 0, 0, 1], 1, 1, 3),     # 2x2 stride 3: two phases of three stored per side
]


def direct_id(s):
    n, cin, h, w, cout, (kh, kw), pads, d, g, st = s
    return f"{n}x{cin}x{h}x{w}x{cout}k{kh}{kw}p{''.join(map(str, pads))}d{d}g{g}s{st}"


@pytest.mark.parametrize("pack", [True, False], ids=["panels-packed", "planes-in-place"])
@pytest.mark.parametrize("weights_as_input", [False, True], ids=["const-w", "input-w"])
@pytest.mark.parametrize("shape", DIRECT, ids=[direct_id(s) for s in DIRECT])
def test_conv_direct_matches_onnxruntime(ctx, shape, weights_as_input, pack):
    """Convolutions read from zero-padded (phase) planes (CPU devices' conv2d_cpu_direct), with the whole epilogue,
    against onnxruntime: every pad side, dilation, strides, wide and one-pixel outputs; each panel's rows copied into
    __local memory first, or read from the planes in place (where they would not fit)."""
    ctx = ctx.with_options(conv_cpu_winograd=False, conv_cpu_direct_pack=pack)
    check_conv(ctx, shape, weights_as_input, "conv2d_cpu_direct")


ROW_TILES = [  # DIRECT's form, with panels inside output rows (rules.direct_row_tiles)
    (1, 3, 63, 63, 20, (3, 3), [0, 0, 0, 0], 1, 1, 2),    # a stem: 31 outputs a row in 2 panels of 16, 4 row blocks
    (2, 4, 11, 30, 13, (3, 3), [1, 1, 1, 1], 1, 1, 1),    # 30 a row, batch 2, 13 output channels: a ragged row block
    (1, 6, 5, 8, 14, (3, 3), [1, 1, 1, 1], 1, 2, 1),      # 8 a row: one panel of 8 (12x8 tiles), 2 groups
    (1, 3, 64, 64, 24, (3, 3), [1, 1, 1, 1], 1, 1, 2),    # shufflenet's stem: 32 a row, whole panels
]


@pytest.mark.parametrize("residual", [True, False], ids=["residual", "relu"])
@pytest.mark.parametrize("row_tiles", [True, False], ids=["row-tiles", "position-panels"])
@pytest.mark.parametrize("shape", ROW_TILES, ids=[direct_id(s) for s in ROW_TILES])
def test_conv_direct_row_tiles(ctx, shape, row_tiles, residual):
    """Panels of positions inside one output row (Options.conv_cpu_direct_row_tiles): without a residual the last
    panel of a row ends at its end, overlapping the one before it; with one, its lanes past the row are dropped."""
    from dlnet.kernels.rules import direct_row_tiles, pick_conv_cpu_tiles
    n, cin, h, w, cout, (kh, kw), pads, d, g, st = shape
    oh, ow = (h + pads[0] + pads[2] - kh) // st + 1, (w + pads[1] + pads[3] - kw) // st + 1
    wq = -(-((ow - 1) * st + kw) // st)
    assert direct_row_tiles(ow, wq, 8 * pick_conv_cpu_tiles(oh * wq)["NV"])  # (what the shapes are for)
    ctx = ctx.with_options(conv_cpu_winograd=False, conv_cpu_direct_row_tiles=row_tiles)
    check_conv(ctx, shape, False, "conv2d_cpu_direct", residual)


def test_direct_row_tiles_rule():
    from dlnet.kernels.rules import direct_row_tiles
    assert direct_row_tiles(111, 112, 16) == 7 and direct_row_tiles(112, 113, 16) == 7
    assert direct_row_tiles(28, 29, 16) == 0 and direct_row_tiles(7, 9, 8) == 0 and direct_row_tiles(8, 10, 8) == 1


def check_conv(ctx, shape, weights_as_input, kernel, residual=True):
    """Conv (+ bias) + residual Add (or not) + Relu of DIRECT's form against onnxruntime; on CPU devices `kernel` runs
    it."""
    import onnxruntime as ort
    n, cin, h, w, cout, (kh, kw), pads, d, g, st = shape
    x = R.uniform(-1, 1, (n, cin, h, w)).astype(np.float32)
    wt = R.uniform(-1, 1, (cout, cin // g, kh, kw)).astype(np.float32)
    b = R.uniform(-1, 1, cout).astype(np.float32)
    oh = (h + pads[0] + pads[2] - d * (kh - 1) - 1) // st + 1
    ow = (w + pads[1] + pads[3] - d * (kw - 1) - 1) // st + 1
    r = R.uniform(-1, 1, (n, cout, oh, ow)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[kh, kw], pads=pads, dilations=[d, d],
                              strides=[st, st], group=g),
             helper.make_node("Add", ["c", "r"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    feeds, inits = {"x": x, "r": r}, {"b": b}
    if not residual:
        nodes = [nodes[0], helper.make_node("Relu", ["c"], ["y"])]
        del feeds["r"]
    (feeds if weights_as_input else inits)["w"] = wt

    def onnxruntime(feeds, inits):
        model = make_model(nodes, feeds, ["y"], inits)
        run = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run
        return model, run(None, feeds)[0]

    model, want = onnxruntime(feeds, inits)
    # the error relative to the same sums of magnitudes (|x|, |w|, |b|, |r|): a float32 sum of C * KH * KW terms that
    # cancel to a small output (one output pixel of 63 terms: 1.006e-5 of the output's norm, against onnxruntime's
    # own float32) is held to what float32 can give
    _, scale = onnxruntime({k: np.abs(v) for k, v in feeds.items()}, {k: np.abs(v) for k, v in inits.items()})
    net = dlnet.Net(ctx).load_onnx(model)
    if ctx.is_cpu:
        assert kernel in [launch.kernel.function_name for launch in net.launches]
    got = net.run(feeds)["y"]
    assert got.shape == want.shape == (n, cout, oh, ow)
    assert np.linalg.norm(got - want) < 1e-5 * np.linalg.norm(scale)
    net.release()


WINOGRAD = [  # DIRECT's form: 3x3 stride 1 with at least Options.conv_cpu_winograd_min_channels channels each side
    (1, 16, 12, 12, 16, (3, 3), [1, 1, 1, 1], 1, 1, 1),   # 6 tiles a row computed as 8, 2 dropped
    (1, 16, 32, 30, 24, (3, 3), [1, 1, 1, 1], 1, 1, 1),   # 15 tiles a row as 16: one row's vector store is partial
    (1, 18, 14, 34, 16, (3, 3), [1, 1, 1, 1], 1, 1, 1),   # 17 tiles a row as 24
    (2, 20, 13, 11, 22, (3, 3), [1, 1, 1, 1], 1, 1, 1),   # odd sides (half tiles), batch 2, ragged rows (22 = 6 + 16)
    (1, 32, 9, 10, 40, (3, 3), [0, 1, 2, 0], 1, 1, 1),    # asymmetric pads
    (1, 24, 3, 3, 17, (3, 3), [0, 0, 0, 0], 1, 1, 1),     # one output pixel: one tile, a quarter of it kept
    (1, 64, 30, 30, 48, (3, 3), [1, 1, 1, 1], 1, 1, 1),   # 225 tiles: 6x16 panels, a ragged last one
    (1, 300, 5, 6, 20, (3, 3), [1, 1, 1, 1], 1, 1, 1),    # 300 channels in __local memory
]


@pytest.mark.parametrize("shape", WINOGRAD, ids=[direct_id(s) for s in WINOGRAD])
def test_conv_winograd_matches_onnxruntime(ctx, shape):
    """3x3 stride-1 convolutions with constant weights as CPU devices' fused Winograd F(2x2, 3x3)
    (conv2d_cpu_wino), with the whole epilogue, against onnxruntime: odd sides, pads, ragged tiles and rows, rows of
    tiles mostly dropped (narrow layers, let through here)."""
    ctx = ctx.with_options(conv_cpu_winograd_max_row=8, conv_cpu_winograd_min_channels=16)
    check_conv(ctx, shape, False, "conv2d_cpu_wino")


@pytest.mark.parametrize("panels", ["one", "several"])
@pytest.mark.parametrize("relu", [True, False], ids=["relu", "affine"])
@pytest.mark.parametrize("n,cin,h,w,cout,g", [(1, 24, 14, 14, 40, 1), (2, 12, 5, 7, 18, 3), (1, 9, 3, 3, 5, 1)],
                         ids=["one-image", "batch2-groups", "tiny"])
def test_conv_prologue_matches_onnxruntime(ctx, n, cin, h, w, cout, g, relu, panels):
    """A 1x1 layer whose input a per-channel Mul, Add, Mul, Add (+ Relu) chain produces (densenet's BatchNorm + Relu
    before each 1x1 layer): on CPU devices that chain runs as the layer packs its panels (fuse_conv_prologues); panels
    within and across images, groups, a panel longer than the image; one panel per work-item, or several
    (Options.conv_cpu_panel_bytes, 2 work-items per core). A Mul along the width is not per channel and stays a
    kernel of its own."""
    import onnxruntime as ort
    if panels == "several":
        ctx = ctx.with_options(conv_cpu_items_per_core=1, conv_cpu_panel_bytes=1 << 20)
    x = R.uniform(-1, 1, (n, cin, h, w)).astype(np.float32)
    def u(lo, hi, *shape):
        return R.uniform(lo, hi, shape).astype(np.float32)
    inits = {"s1": u(0.5, 2, cin, 1, 1), "t1": u(-1, 1, 1, cin, 1, 1), "s2": u(0.5, 2, cin, 1, 1),
             "t2": u(-1, 1, cin, 1, 1), "wt": u(-1, 1, cout, cin // g, 1, 1), "b": u(-1, 1, cout), "row": u(0.5, 2, w)}
    nodes = [helper.make_node("Mul", ["x", "s1"], ["a"]), helper.make_node("Add", ["t1", "a"], ["b1"]),
             helper.make_node("Mul", ["b1", "s2"], ["c"]), helper.make_node("Add", ["c", "t2"], ["d"])]
    nodes += [helper.make_node("Relu", ["d"], ["e"])] if relu else [helper.make_node("Identity", ["d"], ["e"])]
    nodes += [helper.make_node("Conv", ["e", "wt", "b"], ["y"], group=g),
              helper.make_node("Mul", ["x", "row"], ["m"]), helper.make_node("Conv", ["m", "wt", "b"], ["z"], group=g)]
    model = make_model(nodes, {"x": x}, ["y", "z"], inits)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    net = dlnet.Net(ctx).load_onnx(model)
    if ctx.is_cpu:
        assert str(net.graph).count("prologue=") == 1
    got = net.run({"x": x})
    assert rel_l2(got["y"], want[0]) < 1e-5 and rel_l2(got["z"], want[1]) < 1e-5
    net.release()


@pytest.mark.parametrize("pad_in", [True, False])
@pytest.mark.parametrize("n", [1, 2])
def test_channel_shuffle_folds_into_padded_planes(ctx, n, pad_in):
    """shufflenet's channel shuffle (Reshape -> Transpose -> Reshape) before a depthwise layer and before a 3x3 layer:
    on CPU devices each becomes the padding pass's channel map (fold_channel_shuffles), the depthwise one that of
    its own padding (Options.dw_cpu_pad_in) or of a pad_planes launch; a Transpose of rows and columns is not a channel
    shuffle and stays. Against onnxruntime."""
    import onnxruntime as ort
    ctx = ctx.with_options(dw_cpu_pad_in=pad_in)
    c, h, w = 12, 7, 7
    x = R.uniform(-1, 1, (n, c, h, w)).astype(np.float32)
    shuffle = [helper.make_node("Reshape", ["{0}", "s5"], ["{0}5"]),
               helper.make_node("Transpose", ["{0}5"], ["{0}t"], perm=[0, 2, 1, 3, 4]),
               helper.make_node("Reshape", ["{0}t", "s4"], ["{0}s"])]

    def shuffled(v):
        return [helper.make_node(m.op_type, [i.format(v) for i in m.input], [o.format(v) for o in m.output],
                                 **{a.name: helper.get_attribute_value(a) for a in m.attribute}) for m in shuffle]
    nodes = [helper.make_node("Relu", ["x"], ["a"])] + shuffled("a") + [
        helper.make_node("Conv", ["as", "wd", "bd"], ["d"], group=c, pads=[1] * 4),
        helper.make_node("Relu", ["d"], ["e"])] + shuffled("e") + [
        helper.make_node("Conv", ["es", "w3"], ["f"], pads=[1] * 4),
        helper.make_node("Transpose", ["f"], ["ft"], perm=[0, 1, 3, 2]),
        helper.make_node("Conv", ["ft", "w4"], ["y"], pads=[1] * 4)]
    inits = {"s5": np.array([n, 3, c // 3, h, w], np.int64), "s4": np.array([n, c, h, w], np.int64),
             "wd": R.uniform(-1, 1, (c, 1, 3, 3)).astype(np.float32), "bd": R.uniform(-1, 1, c).astype(np.float32),
             "w3": R.uniform(-1, 1, (c, c, 3, 3)).astype(np.float32), "w4": R.uniform(-1, 1, (5, c, 3, 3)).astype(
                 np.float32)}
    model = make_model(nodes, {"x": x}, ["y"], inits)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    net = dlnet.Net(ctx).load_onnx(model)
    if ctx.is_cpu:
        text = str(net.graph)
        maps = [n for n in net._last.graph.nodes if n.attrs.get("in_perm") is not None]
        assert len(maps) == 2 and all(len(n.attrs["in_perm"]) == 12 for n in maps) and text.count("Transpose") == 1
    assert rel_l2(net.run({"x": x})["y"], want) < 1e-5
    net.release()


SEVERAL_PANELS = [  # DIRECT's form: odd planes, batches whose panels cross images, groups, ragged row blocks
    (1, 16, 15, 15, 40, (1, 1), [0, 0, 0, 0], 1, 1, 1),   # 1x1, 225 positions: 15 panels, the last of one column
    (2, 6, 9, 7, 22, (1, 1), [0, 0, 0, 0], 1, 2, 1),      # 1x1, batch 2, 2 groups: a panel across the two images
    (1, 3, 47, 47, 13, (3, 3), [0, 0, 0, 0], 1, 1, 2),    # a stem: 23 outputs a row (row tiles), 13 channels
    (2, 6, 21, 19, 18, (3, 3), [1, 1, 1, 1], 1, 2, 2),    # stride 2, batch 2, 2 groups, panels of positions
    (1, 8, 12, 12, 10, (5, 5), [2, 2, 2, 2], 1, 1, 1),    # 5x5 (no Winograd): rows of 12 in planes of 16
    (1, 2048, 14, 13, 8, (1, 1), [0, 0, 0, 0], 1, 1, 1),  # panels of 128 KiB: 4 of the 12 fill local memory
]


@pytest.mark.parametrize("weights_as_input", [False, True], ids=["const-w", "input-w"])
@pytest.mark.parametrize("path", ["local", "direct", "direct-in-place"])
@pytest.mark.parametrize("shape", SEVERAL_PANELS, ids=[direct_id(s) for s in SEVERAL_PANELS])
def test_conv_several_panels_per_item(ctx, shape, path, weights_as_input):
    """CPU devices' conv2d_cpu_local and conv2d_cpu_direct with several consecutive panels per work-item
    (Options.conv_cpu_panel_bytes; 2 work-items per core here, so even these small layers take several), each row
    block running over them in turn: the last work-item's panels ragged, panels across images and groups."""
    opts = dict(conv_cpu_items_per_core=1, conv_cpu_panel_bytes=1 << 20, conv_cpu_winograd=False)
    if path == "local":
        opts.update(conv_cpu_direct=False, conv_cpu_local_min_bytes=0)
    else:
        opts.update(conv_cpu_direct_pack=path == "direct")
    ctx = ctx.with_options(**opts)
    kernel = "conv2d_cpu_local" if path == "local" or shape[5] == (1, 1) else "conv2d_cpu_direct"
    check_conv(ctx, shape, weights_as_input, kernel)
    if ctx.is_cpu:  # (what the test is for: fewer work-items than panels)
        one = ctx.with_options(conv_cpu_panel_bytes=0)
        model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=list(shape[5]), pads=shape[6],
                                             strides=[shape[9]] * 2, group=shape[8])],
                           {"x": np.zeros(shape[:4], np.float32)}, ["y"],
                           {"w": np.ones((shape[4], shape[1] // shape[8]) + shape[5], np.float32)})
        nets = [dlnet.Net(c).load_onnx(model) for c in (ctx, one)]
        items = [[launch.gsize[0] for launch in net.launches if launch.kernel.function_name == kernel] for net in nets]
        assert items[0][0] < items[1][0]
        tile = nets[0]._last.graph.nodes[0].schedule["tile"]  # (6x16/p4: 4 panels a work-item, in the IR)
        panels = int(tile.split("/p")[1])
        if path != "direct-in-place":  # (packed panels fit the __local memory they go to)
            assert panels * shape[1] // shape[8] * shape[5][0] * shape[5][1] * 16 * 4 <= ctx.dev.local_mem, tile
