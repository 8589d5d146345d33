"""Every GEMM core on this device: the device's own, the portable GPU core (gemm_core.cl) forced onto whatever device
runs the tests (on CI that is PoCL, so the OpenCL fallback every GPU path keeps is checked there), and on NVIDIA the
tf32 tensor-core core (precision="tf32"), whose error is that of tf32 inputs (10-bit mantissa), and the same cores
in fp32 with each operand split in two tf32 halves (Options.fp32_tf32x3), at fp32's error.

Shapes cover every tile class (huge, big, narrow), ragged edges, split-K (long K with few tiles), batched and
transposed GEMMs, convolutions with bias/residual/activation epilogues, and convolution gradients.
"""
from dataclasses import replace

import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.kernels import rules, tuner
from dlnet.kernels.device import Device
from dlnet.kernels.options import Options
from dlnet.kernels.runtime import cl

from ..conftest import context, make_model, rel_l2, tensor_core_context

rng = np.random.default_rng(7)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture(params=["native", "portable", "tf32", "3xtf32"])
def core(request):
    """(context, tolerance) with the GEMM core under test selected; "3xtf32": precision fp32 on the tf32 cores, each
    operand split in two tf32 halves (Options.fp32_tf32x3), at fp32's tolerance."""
    ctx = context()
    if request.param == "portable":  # the GPU's tiled core on a CPU device too: gemm_core.cl instead of gemm_vec.cl
        ctx = ctx.with_options(matrix_core="portable")
        assert ctx.dev.core == "gemm_core"
        return ctx, 1e-5
    if request.param == "tf32":  # every product on the tf32 core, shallow ones too
        return tensor_core_context("tf32", tf32_fp32_k=(0, 0)), 5e-3
    if request.param == "3xtf32":
        if not ctx.is_nvidia:
            pytest.skip("the tf32 cores need an NVIDIA device (inline PTX mma.sync)")
        return ctx.with_options(fp32_tf32x3=True, tf32_fp32_k=(0, 0)), 1e-5
    return ctx, 1e-5


GEMMS = [  # (M, K, N, transA, transB)
    (300, 200, 2100, 0, 0),  # huge tiles with ragged edges
    (70, 45, 90, 0, 1),  # big tiles, B transposed
    (3, 64, 500, 0, 0),  # narrow m
    (130, 64, 3, 1, 0),  # narrow n, A transposed
    (260, 200, 700, 1, 0),  # huge tiles, A transposed (a weight gradient: tensor cores copy it along m), ragged
    (300, 132, 520, 0, 1),  # huge tiles, B transposed (a weight read [N, K] as stored: copied along k), ragged
    (64, 3000, 64, 1, 1),  # one tile, long K: split-K
]


@pytest.mark.parametrize("M,K,N,ta,tb", GEMMS)
def test_gemm(core, M, K, N, ta, tb):
    ctx, tol = core
    a, b, c = f32(*((K, M) if ta else (M, K))), f32(*((N, K) if tb else (K, N))), f32(N)
    model = make_model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=ta, transB=tb, alpha=0.5)],
                       {"a": a, "b": b}, ["y"], {"c": c})
    y = dlnet.Net(ctx).load_onnx(model).run({"a": a, "b": b})["y"]
    A, B = (a.T if ta else a).astype(np.float64), (b.T if tb else b).astype(np.float64)
    assert rel_l2(y, 0.5 * A @ B + c) < tol


def test_batched_matmul(core):
    ctx, tol = core
    a, b = f32(3, 2, 100, 40), f32(2, 40, 70)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"])
    y = dlnet.Net(ctx).load_onnx(model).run({"a": a, "b": b})["y"]
    assert rel_l2(y, a.astype(np.float64) @ b.astype(np.float64)) < tol


CONVS = [  # (x shape, w shape, attrs)
    ((2, 16, 20, 20), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 24, 15, 15), (48, 8, 3, 3), {"strides": [2, 2], "group": 3}),
    ((2, 64, 7, 7), (96, 64, 1, 1), {}),
    # 1x1 on images of whole groups of 4 pixels (tensor cores: 16-byte copies of x), tiles across images, ragged rows
    ((3, 64, 12, 12), (160, 64, 1, 1), {}),
    ((2, 96, 8, 8), (96, 32, 1, 1), {"group": 3}),
    ((1, 256, 6, 6), (32, 256, 3, 3), {"pads": [1, 1, 1, 1]}),  # long K, few tiles: split-K
    ((2, 32, 13, 13), (24, 32, 5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),  # tap-major depth (GPU cores)
    ((1, 16, 12, 11), (8, 16, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
]


def conv_ref(x, w, b, attrs):
    import onnx.reference
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], {"x": x}, ["y"],
                       {"w": w.astype(np.float64), "b": b.astype(np.float64)})
    for v in list(model.graph.input) + list(model.graph.output):
        v.type.tensor_type.elem_type = 11  # DOUBLE
    return onnx.reference.ReferenceEvaluator(model).run(None, {"x": x.astype(np.float64)})[0]


@pytest.mark.parametrize("xs,ws,attrs", CONVS)
def test_conv_with_epilogue(core, xs, ws, attrs):
    """Conv + bias + residual + Relu fused into the core's epilogue."""
    ctx, tol = core
    check_conv_with_epilogue(ctx, tol, xs, ws, attrs)


def check_conv_with_epilogue(ctx, tol, xs, ws, attrs, then=None):
    """then: a unary op after the Relu (so that the convolution's output is an inner value, half in fp16)."""
    x, w, b = f32(*xs), f32(*ws), f32(ws[0])
    ref = conv_ref(x, w, b, attrs)
    r = f32(*ref.shape)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Add", ["c", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["t" if then else "y"])] + \
        ([helper.make_node(then, ["t"], ["y"])] if then else [])
    net = dlnet.Net(ctx).load_onnx(make_model(nodes, {"x": x, "r": r}, ["y"], {"w": w, "b": b}))
    want = np.maximum(ref + r, 0)
    assert rel_l2(net.run({"x": x, "r": r})["y"], 1 / (1 + np.exp(-want)) if then else want) < tol
    return net


def test_fp16_half_operands_on_the_tensor_cores():
    """precision "fp16": a product of two values stored in half that gemm_ldsm.cl and gemm_wgmma.cl do not take (N
    not whole 16-byte rows) runs on gemm_mma.cl with its tiles through registers (cp.async cannot convert half)."""
    a, b = f32(70, 200), f32(200, 90)
    nodes = [helper.make_node("Tanh", ["a"], ["ah"]), helper.make_node("Tanh", ["b"], ["bh"]),
             helper.make_node("MatMul", ["ah", "bh"], ["y"])]
    ctx = tensor_core_context("fp16", tf32_fp32_k=(0, 0))
    net = dlnet.Net(ctx).load_onnx(make_model(nodes, {"a": a, "b": b}, ["y"]))
    src = net.launches[-1].kernel.program.get_info(cl.program_info.SOURCE)
    defs = [line.split()[1] for line in src.splitlines() if line.startswith("#define ")]
    assert {"WARPS_M", "A_HALF", "B_HALF"} <= set(defs) and "STAGES" not in defs[:defs.index("A_HALF")]
    y = net.run({"a": a, "b": b})["y"]
    assert rel_l2(y, np.tanh(a.astype(np.float64)) @ np.tanh(b.astype(np.float64))) < 1e-2


@pytest.mark.parametrize("xs,ws,attrs", CONVS)
def test_fp16_conv_with_epilogue_on_the_tensor_cores(xs, ws, attrs):
    """precision "fp16" on gemm_mma.cl, y stored in half (elsewhere than NVIDIA through registers, no cp.async), the
    epilogue's loads of a block of rows issued before its stores."""
    ctx = tensor_core_context("fp16", tf32_fp32_k=(0, 0))
    net = check_conv_with_epilogue(ctx, 1e-2, xs, ws, attrs, then="Sigmoid")
    conv = next(n for n in net.graph.nodes if n.op == "Conv")
    assert conv.outputs[0].dtype == "float16" and net.ctx.dev.mma


@pytest.mark.parametrize("shared", [False, True])
def test_conv_of_an_input_uploaded_in_chunks(core, shared):
    """A convolution alone reading a graph input runs in INPUT_CHUNKS launches over slices of the batch (uneven
    here: 6 images in 4), each awaiting its slice's upload on the copy queue; with its residual another input, and
    twice (the second time from a pinned array) so that a stale slice would show. An input that a second node reads
    too goes up whole (and the residual, which the convolution alone reads, in chunks)."""
    ctx, tol = core
    ctx = ctx.with_options(input_chunk_min_bytes=0)
    assert ctx.options.input_chunks == 4
    w, b = f32(24, 16, 3, 3), f32(24)
    attrs = {"pads": [1, 1, 1, 1]}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Add", ["c", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])] + ([helper.make_node("Neg", ["x"], ["n"])] if shared else [])
    x0, r0 = f32(6, 16, 12, 12), f32(6, 24, 12, 12)
    model = make_model(nodes, {"x": x0, "r": r0}, ["y"] + (["n"] if shared else []), {"w": w, "b": b})
    net = dlnet.Net(ctx).load_onnx(model)
    for pinned in (False, True):
        x, r = f32(6, 16, 12, 12), f32(6, 24, 12, 12)
        if pinned:
            xp = net.input_array("x")
            xp[...] = x
            x = xp
        y = net.run({"x": x, "r": r})["y"]
        assert rel_l2(y, np.maximum(conv_ref(np.asarray(x), w, b, attrs) + r, 0)) < tol
    waits = [la.wait for la in net.launches if la.wait is not None]
    gpu_core = ctx.dev.tiled
    assert sorted(set(waits)) == ([] if not gpu_core else [(1 if shared else 0, c) for c in range(4)])
    assert sorted(net._last.input_chunks) == ([] if not gpu_core else [1 if shared else 0])


def float64_ref(model, feeds):
    """onnx.reference on the model in float64 (inputs, outputs and initializers)."""
    import onnx
    import onnx.reference
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for v in list(model.graph.input) + list(model.graph.output):
        v.type.tensor_type.elem_type = 11  # DOUBLE
    for i, init in enumerate(model.graph.initializer):
        a = onnx.numpy_helper.to_array(init)
        if a.dtype == np.float32:
            model.graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(a.astype(np.float64), init.name))
    feeds = {k: v.astype(np.float64) for k, v in feeds.items()}
    return onnx.reference.ReferenceEvaluator(model).run(None, feeds)


@pytest.mark.slow  # (GPU kernels emulated on PoCL: minutes on 2 cores; CI runs them once)
def test_layers_over_slices_of_an_input_uploaded_in_chunks(core):
    """The chain after a large input (conv + relu, max pool, conv, sigmoid) runs slice after slice of the batch (6
    images in 4 uneven slices), each slice's launches awaiting its upload; it stops at the convolution past the
    multiply-add budget, which runs on the whole batch. Every value the chain reads or writes has its own block
    (a later layer's output on an earlier one's would be overwritten by the next slice), of one slice (two images)
    where the chain hands it on. Against float64, twice; and with Options(input_chunks=1)."""
    ctx, tol = core
    ctx = ctx.with_options(input_chunk_min_bytes=0, chunk_min_pixels={"fp32": 100, "tf32": 100},
                           chunk_flops_per_byte={"fp32": 100, "tf32": 100},
                           debug_bounds=True)  # a slice written past its block fails the run
    inits = {"w1": f32(16, 8, 3, 3) / 8, "b1": f32(16), "w2": f32(16, 16, 3, 3) / 12, "b2": f32(16),
             "w3": f32(8, 16, 1, 1) / 4, "b3": f32(8)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="c1"),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="p1"),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="c2"),
             helper.make_node("Sigmoid", ["c2"], ["s2"]),
             helper.make_node("Conv", ["s2", "w3", "b3"], ["y"], name="c3")]
    x0 = f32(6, 8, 20, 20)
    model = make_model(nodes, {"x": x0}, ["y"], inits)
    gpu_core = ctx.dev.tiled
    net = dlnet.Net(ctx).load_onnx(model)
    for _ in range(2):
        x = f32(6, 8, 20, 20)
        assert rel_l2(net.run({"x": x})["y"], float64_ref(model, {"x": x})[0]) < tol
    plan = net._last
    if not gpu_core:
        assert plan.prefix is None and not any(la.wait for la in net.launches)
        return
    chain = plan.graph.nodes[plan.prefix.start:plan.prefix.stop]
    assert [n.name for n in chain if n.op in ("Conv", "MaxPool")] == ["c1", "p1", "c2"]
    assert plan.prefix.chunks == [(0, 1), (1, 2), (3, 1), (4, 2)]
    waits = [la.wait for la in net.launches]
    sliced = [c for w in waits if w is not None for c in [w[1]]]
    assert sliced == sorted(sliced) and sorted(set(sliced)) == [0, 1, 2, 3]  # slice after slice
    assert waits[len(sliced):] == [None] * (len(waits) - len(sliced))  # then c3, whole
    assert all("images" in la.label for la in net.launches[:len(sliced)])
    mem = plan.memory
    assert mem.per_slice == {v.id for n in chain[:-1] for v in n.outputs}  # handed on: a block of one slice
    blocks = sorted({(mem.act_offsets[v.id], v.nbytes // 6 * 2 if v.id in mem.per_slice else v.nbytes)
                     for n in chain for v in n.inputs + n.outputs
                     if v is not None and v.const is None and v.id in mem.act_offsets})
    assert all(o1 + n1 <= o2 for (o1, n1), (o2, _) in zip(blocks, blocks[1:]))
    whole = dlnet.Net(ctx.with_options(input_chunks=1)).load_onnx(model)
    assert whole._last.prefix is None and not any(la.wait for la in whole.launches)
    assert rel_l2(whole.run({"x": x})["y"], float64_ref(model, {"x": x})[0]) < tol


def test_conv_tap_major(core):
    """On the GPU cores, constant weights of several taps and 16k channels are stored [K, KH, KW, C] and the
    depth runs tap by tap (one window-table entry per slice of it); Options(tap_major=False) keeps (c, ky, kx). Both
    against float64."""
    ctx, tol = core
    x, w, b = f32(2, 48, 9, 10), f32(20, 48, 5, 3), f32(20)
    attrs = {"pads": [2, 1, 2, 1]}
    ref = conv_ref(x, w, b, attrs)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], {"x": x}, ["y"], {"w": w, "b": b})
    gpu_core = ctx.dev.tiled
    for on in (True, False):
        net = dlnet.Net(ctx.with_options(tap_major=on)).load_onnx(model)
        y = net.run({"x": x})["y"]
        assert rel_l2(y, ref) < tol
        conv = [n for n in net.graph.nodes if n.op == "Conv"][0]
        assert bool(conv.attrs.get("tap_major")) == (on and gpu_core)


@pytest.mark.parametrize("M,N", [(64, 2100), (48, 4100)])
def test_tf32_wide_tile(M, N):
    """The tf32 core's 64 x 128 tile (products of at most 64 rows and many columns), ragged, against float64."""
    ctx = tensor_core_context("tf32", tf32_huge_fill=0)
    assert rules.pick_tiles(ctx.dev, ctx.options, M, N, 300).tiles["WARPS_M"] == 1
    a, b = f32(M, 300), f32(300, N)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"])
    y = dlnet.Net(ctx).load_onnx(model).run({"a": a, "b": b})["y"]
    assert rel_l2(y, a.astype(np.float64) @ b.astype(np.float64)) < 5e-3


# an NVIDIA device of 132 compute units in tf32 mode, as rules.pick_tiles sees it
FAKE_NVIDIA = Device("fake", False, True, "tf32", 132, 48 << 10, "gemm_core", mma=True)


@pytest.mark.parametrize("M,N,K,deep,shape", [
    (384, 2704, 1728, True, "tall"),  # alexnet features.6 at batch 16
    (384, 2704, 1728, False, "big"),  # ... with depth slices of 32 not whole (channel-major window)
    (512, 784, 256, True, "big"),  # too shallow for the tall tile
    (96, 2000, 1728, True, "big"),  # too few rows
    (192, 11664, 1600, True, "huge96"),  # alexnet features.3: 96-row tiles pad nothing
    (256, 50176, 576, True, "huge"),
])
def test_tf32_tile_choice(M, N, K, deep, shape):
    """Which tf32 tile a product gets (the rule, on any machine): the tall 128 x 64 x 32 tile for products of at
    least 128 rows and depth 512 that the big tile would take, the 96-row one where it pads M less than 128 rows."""
    pick = rules.pick_tiles(FAKE_NVIDIA, Options(), M, N, K, deep=deep)
    assert pick.core == "gemm_mma" and pick.name == f"tf32:{shape}"
    assert pick.tiles == rules.GEMM_TILES["tf32"][shape]


@pytest.mark.slow  # (20 s a case with mma.sync emulated)
@pytest.mark.parametrize("xs,ws,attrs,mm,mnk", [
    ((2, 64, 14, 14), (128, 64, 3, 3), {"pads": [1, 1, 1, 1]}, None, (128, 392, 576)),  # tall, tap-major
    ((2, 512, 7, 7), (160, 512, 1, 1), {}, None, (160, 98, 512)),  # tall, 1x1, ragged M
    ((2, 96, 15, 15), (136, 96, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, None, (136, 128, 864)),  # strided
    (None, None, None, (192, 300, 2100), None),  # huge96, ragged N
])
def test_tf32_tall_and_huge96_tiles(xs, ws, attrs, mm, mnk):
    """The tf32 core's tall (128 x 64 x 32, three stages) and 96-row tiles against float64, with the epilogue."""
    ctx = tensor_core_context("tf32", tf32_huge_fill=0)
    if mm:
        M, K, N = mm
        assert rules.pick_tiles(ctx.dev, ctx.options, M, N, K).tiles["TM"] == 96
        a, b = f32(M, K), f32(K, N)
        model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"])
        net = dlnet.Net(ctx).load_onnx(model)
        y, ref = net.run({"a": a, "b": b})["y"], a.astype(np.float64) @ b.astype(np.float64)
    else:
        assert rules.pick_tiles(ctx.dev, ctx.options, *mnk).tiles["TK"] == 32
        x, w, b = f32(*xs), f32(*ws), f32(ws[0])
        ref = np.maximum(conv_ref(x, w, b, attrs), 0)
        model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
                            helper.make_node("Relu", ["c"], ["y"])], {"x": x}, ["y"], {"w": w, "b": b})
        net = dlnet.Net(ctx).load_onnx(model)
        y = net.run({"x": x})["y"]
    assert rel_l2(y, ref) < 5e-3


def check_gradients_against_torch(ctx, tol, model, x, y):
    """One SGD(lr=0) step of `model` exported to ONNX: every parameter gradient against torch autograd. Returns the
    labels of the step's forward and backward launches."""
    import io

    import onnx
    import torch

    from dlnet.train import Trainer
    buf = io.BytesIO()
    torch.onnx.export(model, (torch.from_numpy(x),), buf, opset_version=13, dynamo=False, input_names=["input"],
                      output_names=["output"])
    net = dlnet.Net(ctx).load_onnx(onnx.load_from_string(buf.getvalue()))
    tr = Trainer(net, loss="cross_entropy", optimizer=dlnet.optim.SGD(lr=0.0))
    tr.step({"input": x, "target": y})
    grads = {n: tr._active.download(ctx, gv) for n, _, gv in tr._active.params}
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    for name, p in model.named_parameters():
        assert rel_l2(grads[name], p.grad.numpy()) < max(tol, 1e-4) * 10, name
    return [launch.label for launch in tr._active.plan.launches]


@pytest.mark.slow
def test_conv_gradients(core):
    """dW and dX of a convolution (the conv_grad_gemm kernels on this core) against torch autograd."""
    torch = pytest.importorskip("torch")
    ctx, tol = core
    conv = torch.nn.Conv2d(8, 40, 3, padding=1, stride=2)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1),
                                torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2),
                                torch.nn.Conv2d(8, 8, 1, groups=2), conv, torch.nn.Flatten(),
                                torch.nn.Linear(40 * 6 * 6, 10))
    x, y = f32(4, 3, 11, 11), rng.integers(0, 10, 4)  # 484 pixels: k runs past the last full tile
    check_gradients_against_torch(ctx, tol, model, x, y)


@pytest.mark.parametrize("panels", [True, False])
def test_conv_gradients_in_panels_on_cpus(panels):
    """On CPU devices dW and dX of convolutions run as gemm_cpu.cl products (Options.conv_grad_cpu_panels: dy
    gathered into rows of channels, B packed into panels; a product per group), against torch autograd: groups,
    stride, padding, dilation, a 1x1 layer, ragged panels (40 output channels, 3 x 3 x 3 = 27 columns), a padding past
    the kernel's reach at stride 3 (taps that read no pixel of some rows: col2im_scatter's empty runs)."""
    torch = pytest.importorskip("torch")
    ctx = context()
    if ctx.dev.tiled:
        pytest.skip("the CPU devices' path")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1),
                                torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2),
                                torch.nn.Conv2d(8, 8, 1, groups=2), torch.nn.Conv2d(8, 40, 3, padding=1, stride=2),
                                torch.nn.Conv2d(40, 6, 3, padding=3, stride=3), torch.nn.Flatten(),
                                torch.nn.Linear(6 * 3 * 3, 10))
    x, y = f32(3, 3, 9, 9), rng.integers(0, 10, 3)
    labels = check_gradients_against_torch(ctx.with_options(conv_grad_cpu_panels=panels), 1e-5, model, x, y)
    assert any(label.endswith("ConvGradW rows") for label in labels) == panels, labels


@pytest.mark.slow
def test_conv_weight_gradient_split_k(core):
    """dW with its pixel axis split across slices (split-K) and ragged at the end: 2 * 23 * 23 = 1058 pixels, so
    the window fetches run past the last pixel and past the last (c, ky, kx) column into the table's padding."""
    torch = pytest.importorskip("torch")
    ctx, tol = core
    model = torch.nn.Sequential(torch.nn.Conv2d(7, 16, 3, padding=1), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 23 * 23, 5))
    x, y = f32(2, 7, 23, 23), rng.integers(0, 5, 2)
    labels = check_gradients_against_torch(ctx, tol, model, x, y)
    if ctx.dev.core == "gemm_core":  # the split this test is about
        assert any("splitK" in label and "ConvGrad" in label for label in labels), labels


@pytest.mark.parametrize("m,n,k", [(1, 37, 260), (3, 300, 64), (8, 129, 1028), (5, 8, 4)])
def test_gemv(core, m, n, k):
    """A fully connected layer of at most 8 rows with transB=1 weights runs as gemv.cl: bias (beta), alpha and a
    fused Relu, ragged column groups; a K that is not a multiple of 4 keeps the GEMM core."""
    ctx, tol = core
    if not ctx.dev.tiled:
        pytest.skip("gemv.cl stands in for the GPU cores (forced onto CPUs by the 'portable' case)")
    for kk, want in [(k, True), (k + 1, False)]:
        a, w, bias = f32(m, kk), f32(n, kk), f32(n)
        model = make_model([helper.make_node("Gemm", ["a", "w", "c"], ["g"], transB=1, alpha=0.7, beta=1.3),
                            helper.make_node("Relu", ["g"], ["y"])], {"a": a}, ["y"], {"w": w, "c": bias})
        net = dlnet.Net(ctx).load_onnx(model)
        assert any("gemv" in launch.label for launch in net.launches) == want, [x.label for x in net.launches]
        ref = np.maximum(0.7 * a.astype(np.float64) @ w.T.astype(np.float64) + 1.3 * bias, 0)
        assert rel_l2(net.run({"a": a})["y"], ref) < (1e-5 if want else tol)


def test_split_k_partials_in_the_arena(core):
    """A product of few rows and a long K splits K; its partial sums go to a block of the activation arena that is
    free at that layer (where the first convolution's output was), not to a buffer of their own. Alone, with no
    such block, they get their own buffer. Both against float64."""
    ctx, tol = core
    if ctx.dev.core == "gemm_vec":
        pytest.skip("split-K is the GPU cores' (forced onto CPUs by the 'portable' case)")
    x, v, w, fc = f32(2, 8, 40, 40), f32(8, 8, 1, 1), f32(4, 8, 1, 1), f32(4 * 40 * 40, 16)
    a = np.einsum("nchw,kc->nkhw", x.astype(np.float64), v[:, :, 0, 0])
    ref = (np.einsum("nchw,kc->nkhw", a, w[:, :, 0, 0]).reshape(2, -1)) @ fc
    model = make_model([helper.make_node("Conv", ["x", "v"], ["a"]), helper.make_node("Conv", ["a", "w"], ["c"]),
                        helper.make_node("Flatten", ["c"], ["f"]), helper.make_node("MatMul", ["f", "fc"], ["y"])],
                       {"x": x, "fc": fc}, ["y"], {"v": v, "w": w})
    net = dlnet.Net(ctx).load_onnx(model)
    assert any("splitK" in launch.label for launch in net.launches)
    assert rel_l2(net.run({"x": x, "fc": fc})["y"], ref) < tol
    assert "splitk" not in net._last.lowerer.scratch
    fx = f32(2, 6400)
    alone = make_model([helper.make_node("MatMul", ["f", "fc"], ["y"])], {"f": fx, "fc": fc}, ["y"])
    net = dlnet.Net(ctx).load_onnx(alone)
    assert rel_l2(net.run({"f": fx, "fc": fc})["y"], fx.astype(np.float64) @ fc) < tol
    assert "splitk" in net._last.lowerer.scratch


@pytest.mark.slow
@pytest.mark.parametrize("shape", sorted(rules.GPU_TILE_MODEL))
def test_each_gpu_tile(shape, monkeypatch):
    """Every tile of the fp32 GPU table on this device (the portable core forced onto CPUs): a convolution with
    its epilogue, a ragged GEMM, and a convolution's weight and input gradients, with that tile picked for all
    (a tile model of that one shape: no Options field names a tile model, so the tuner's function stands in)."""
    ctx = context().with_options(matrix_core="portable")
    monkeypatch.setattr(tuner, "tile_model", lambda ctx: {shape: rules.GPU_TILE_MODEL[shape]})
    xs, ws, attrs = CONVS[0]
    x, w, b = f32(*xs), f32(*ws), f32(ws[0])
    ref = conv_ref(x, w, b, attrs)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], {"x": x}, ["y"],
                       {"w": w, "b": b})
    net = dlnet.Net(ctx).load_onnx(model)
    want = "".join(f"#define {k} {v}\n" for k, v in rules.GEMM_TILES["gpu"][shape].items())
    assert any(launch.kernel.program.get_info(cl.program_info.SOURCE).startswith(want)
               for launch in net.launches if launch.kernel.function_name == "conv2d")
    assert rel_l2(net.run({"x": x})["y"], ref) < 1e-5
    a, bm = f32(130, 77), f32(77, 150)
    gm = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": bm}, ["y"])
    y = dlnet.Net(ctx).load_onnx(gm).run({"a": a, "b": bm})["y"]
    assert rel_l2(y, a.astype(np.float64) @ bm) < 1e-5
    test_conv_weight_gradient_split_k((ctx, 1e-5))


WINOGRAD_CONVS = [  # (x shape, output channels, pads)
    ((2, 16, 20, 20), 24, 1),
    ((1, 8, 7, 9), 8, 1),  # odd output sizes: ragged 2x2 tiles
    ((2, 8, 6, 5), 16, 0),
    ((1, 12, 5, 5), 8, 2),
    ((1, 600, 4, 4), 16, 1),  # few tiles, long K: the batched GEMM split along K
    ((2, 16, 40, 40), 8, 1),  # 800 tiles in chunks of 256, the last one ragged
]


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("xs,k,p", WINOGRAD_CONVS)
def test_winograd_conv(core, xs, k, p, m):
    """3x3 stride-1 convolutions through Winograd F(2x2, 3x3) or F(4x4, 3x3) (input transform, 16 or 36 products as
    one batched GEMM on the core, output transform with bias + residual + Relu) against float64."""
    ctx, tol = core
    if ctx.dev.core != "gemm_core":
        pytest.skip("Winograd runs on the GPU core (forced onto CPUs by the 'portable' case)")
    ctx = ctx.with_options(winograd_m=m, winograd_m_tf32=m, winograd_f4_min_tiles=0, winograd_min_channels=8,
                           winograd_min_channels_tf32=0, winograd_min_layer_tiles=0)
    if xs[2] == 40:  # no free block in the arena at that layer: chunks of the least the planner must give
        ctx = ctx.with_options(winograd_min_tiles=256, winograd_whole_bytes=0)
    x, w, b = f32(*xs), f32(k, xs[1], 3, 3), f32(k)
    attrs = {"pads": [p] * 4}
    ref = conv_ref(x, w, b, attrs)
    r = f32(*ref.shape)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
                        helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                       {"x": x, "r": r}, ["y"], {"w": w, "b": b})
    net = dlnet.Net(ctx).load_onnx(model)
    labels = [launch.label for launch in net.launches]
    gemms = [label for label in labels if "winograd" in label and " gemm" in label and "reduce" not in label]
    assert len(gemms) == (4 if xs[2] == 40 and m == 2 else 1), labels  # (F(4x4): 200 tiles, one chunk)
    assert all(f"winograd{'4' if m == 4 else ''} " in label for label in gemms), labels  # every shape here pays
    assert "winograd=1" in str(net.graph)
    assert rel_l2(net.run({"x": x, "r": r})["y"], np.maximum(ref + r, 0)) < tol


@pytest.mark.slow
def test_winograd_only_where_it_applies():
    """Strided, grouped or narrow convolutions keep the implicit GEMM; so does a layer of fewer tiles than
    winograd_min_layer_tiles."""
    ctx = context().with_options(matrix_core="portable", winograd_min_channels=16, winograd_min_layer_tiles=20)
    for xs, ws, attrs, want in [((1, 16, 9, 9), (16, 16, 3, 3), {"pads": [1] * 4}, True),
                                ((1, 16, 9, 9), (16, 16, 3, 3), {"strides": [2, 2]}, False),
                                ((1, 16, 9, 9), (16, 8, 3, 3), {"group": 2}, False),
                                ((1, 8, 9, 9), (16, 8, 3, 3), {}, False),
                                ((1, 16, 9, 9), (16, 16, 3, 3), {"dilations": [2, 2]}, False),
                                ((1, 16, 7, 7), (16, 16, 3, 3), {"pads": [1] * 4}, False)]:  # 16 tiles < 20
        x, w = f32(*xs), f32(*ws)
        model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], {"x": x}, ["y"], {"w": w})
        net = dlnet.Net(ctx).load_onnx(model)
        assert any("winograd" in launch.label for launch in net.launches) == want, (attrs, ws)
        assert rel_l2(net.run({"x": x})["y"], conv_ref(x, w, np.zeros(ws[0], np.float32), attrs)) < 1e-5


def test_winograd_f4_on_large_layers():
    """F(4x4, 3x3) only on layers of at least winograd_f4_min_tiles 4x4 tiles (its U is 36/9 of the weights);
    smaller ones keep F(2x2, 3x3)."""
    ctx = context().with_options(matrix_core="portable", winograd_m=4, winograd_m_tf32=4, winograd_f4_min_tiles=30,
                                 winograd_min_channels=8, winograd_min_channels_tf32=0, winograd_min_layer_tiles=0)
    for n, kind in [(1, "winograd "), (2, "winograd4 ")]:  # 25 and 50 tiles of 4x4
        x, w = f32(n, 16, 20, 20), f32(8, 16, 3, 3)
        attrs = {"pads": [1] * 4}
        model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], {"x": x}, ["y"], {"w": w})
        net = dlnet.Net(ctx).load_onnx(model)
        assert any(kind in launch.label for launch in net.launches), [launch.label for launch in net.launches]
        assert rel_l2(net.run({"x": x})["y"], conv_ref(x, w, np.zeros(8, np.float32), attrs)) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("pad,chunk", [(1, None), (0, None), (2, None), (1, 24)])
def test_winograd_training(core, pad, chunk, monkeypatch):
    """Training: the convolutions (weights that change every step) and their input gradients run as Winograd with
    U made on the device (wino_weights; dX's filters flipped and transposed, pads 2 - p), and so do their weight
    gradients (wino_dy, the 16 sums over tiles, wino_dw; chunk: in chunks of that many tiles, each GEMM adding to
    the last); every parameter gradient against torch autograd."""
    torch = pytest.importorskip("torch")
    ctx, tol = core
    if ctx.dev.core != "gemm_core":
        pytest.skip("Winograd runs on the GPU core (forced onto CPUs by the 'portable' case)")
    ctx = ctx.with_options(winograd_min_channels=8, winograd_min_channels_tf32=0, winograd_min_layer_tiles=0)
    if chunk:  # (chunks of a set size: no option asks for one, the planner's block decides)
        from dlnet.kernels.families import winograd
        monkeypatch.setattr(winograd, "wino_chunk", lambda T, nbytes, C, K, options, nx=16: min(T, chunk))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 12, 3, padding=pad), torch.nn.ReLU(),
                                torch.nn.Conv2d(12, 8, 3, padding=1, bias=False), torch.nn.Flatten(),
                                torch.nn.Linear(8 * (11 + 2 * pad - 2) ** 2, 5))
    x, y = f32(2, 3, 11, 11), rng.integers(0, 5, 2)
    labels = check_gradients_against_torch(ctx, tol, model, x, y)
    assert sum("winograd weights" in label for label in labels) == 4, labels  # 2 forward, 2 dX
    assert any("ConvGradX winograd" in label for label in labels), labels
    assert sum("ConvGradW winograd dw" in label for label in labels) == 2, labels
    assert not chunk or any("ConvGradW winograd tiles 24+" in label for label in labels), labels


def test_winograd_weight_transform():
    """U = G w G^T in float32 against the float64 product; F(4x4, 3x3)'s matrices reproduce the 3-tap correlation."""
    from dlnet.graph.passes.winograd import AT4, BT4, G, G4, transform_weights
    w = f32(24, 40, 3, 3)
    assert rel_l2(transform_weights(w), np.einsum("ai,kcij,bj->abkc", G, w.astype(np.float64), G)) < 1e-7
    assert rel_l2(transform_weights(w, 4), np.einsum("ai,kcij,bj->abkc", G4, w.astype(np.float64), G4)) < 1e-7
    d, g = rng.standard_normal(6), rng.standard_normal(3)
    assert np.allclose(AT4 @ ((G4 @ g) * (BT4 @ d)), [d[i:i + 3] @ g for i in range(4)], rtol=0, atol=1e-12)


def test_winograd_workspace_in_the_arena():
    """A chain of Winograd convolutions with a residual: each layer's V and M sit in a block of the activation
    arena that is free at that layer (planned around live values), chunked where the block is short."""
    ctx = context().with_options(matrix_core="portable", winograd_min_channels=8, winograd_min_layer_tiles=0,
                                 winograd_min_tiles=256)
    ws = {f"w{i}": (f32(16, 16, 3, 3) * 0.3).astype(np.float32) for i in range(3)}
    pads = {"pads": [1, 1, 1, 1]}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], **pads), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w1"], ["c"], **pads), helper.make_node("Relu", ["c"], ["d"]),
             helper.make_node("Conv", ["d", "w2"], ["e"], **pads), helper.make_node("Add", ["e", "b"], ["y"])]
    x = f32(2, 16, 34, 30)
    model = make_model(nodes, {"x": x}, ["y"], ws)
    net = dlnet.Net(ctx).load_onnx(model)
    assert sum("winograd" in launch.label for launch in net.launches) >= 9
    assert net._last.memory.temps
    want = onnx_reference(model, {"x": x})
    assert rel_l2(net.run({"x": x})["y"], want) < 1e-5


def onnx_reference(model, feeds):
    from tests.conftest import reference
    return reference(model, feeds)[0]


def _tf32_linear(ctx, M, N, K, act, **options):
    """A Linear layer (MatMul, bias Add, act) in tf32 on ctx's device with `options`, on inputs drawn for M, N and K:
    (net, output, float64 reference)."""
    ctx = dlnet.Context(ctx.info, precision="tf32", options=ctx.options.replace(ldsm_min_rows=256, **options))
    r = np.random.default_rng(M * N + K)
    a, w, bias = (r.standard_normal(s).astype(np.float32) for s in ((M, K), (K, N), (N,)))
    nodes = [helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["p", "bias"], ["q" if act else "y"])]
    if act:
        nodes.append(helper.make_node(act, ["q"], ["y"]))
    net = dlnet.Net(ctx).load_onnx(make_model(nodes, {"a": a}, ["y"], {"w": w, "bias": bias}))
    ref = a.astype(np.float64) @ w.astype(np.float64) + bias
    return net, net.run({"a": a})["y"], np.maximum(ref, 0) if act else ref


# (N a multiple of 8 for gemm_wgmma.cl; K 200 and 1028 not whole slices of 32)
TF32_LINEARS = [(300, 264, 200, None), (1000, 1032, 768, "Relu"), (257, 384, 256, None), (260, 264, 1028, None),
                (2100, 2064, 2084, None)]  # (the last deep: 128 x 256 tiles)


@pytest.mark.parametrize("M,N,K,act", TF32_LINEARS)
def test_tf32_ldsm_core(M, N, K, act):
    """gemm_ldsm.cl (tf32, ldmatrix fragments, B stored [N, K] at load) on a Linear layer: ragged M and N, a bias
    as C and an activation epilogue, against float64."""
    ctx = context()
    if not ctx.is_nvidia:
        pytest.skip("the tf32 cores need an NVIDIA device (inline PTX mma.sync)")
    net, y, ref = _tf32_linear(ctx, M, N, K, act, wgmma=False)
    assert "ldsm" in str(net.graph)
    assert rel_l2(y, ref) < 5e-3


@pytest.mark.parametrize("M,N,K,act", TF32_LINEARS)
def test_tf32_wgmma_core(M, N, K, act):
    """On Hopper in tf32, the same layers run on gemm_wgmma.cl (wgmma k8 on tf32): against float64 at tf32's error,
    and against gemm_ldsm.cl to float accuracy, since both round the operands to nearest tf32 (wgmma alone would
    truncate them: a relative error near 1e-3, biased)."""
    ctx = context()
    if not ctx.is_nvidia or not dlnet.Context(ctx.info, precision="tf32").dev.wgmma:
        pytest.skip("gemm_wgmma.cl needs an NVIDIA Hopper GPU")
    net, y, ref = _tf32_linear(ctx, M, N, K, act)
    assert ("wgmma128x256" if K >= 2048 else "wgmma128x128") in str(net.graph)
    assert rel_l2(y, ref) < 7e-4
    off, y_ldsm, _ = _tf32_linear(ctx, M, N, K, act, wgmma=False)
    assert "wgmma" not in str(off.graph)
    assert rel_l2(y, y_ldsm) < 2e-5
    assert "/y8" in str(net.graph)  # (its tile through __local memory in runs of 8 columns)


def test_fp32_on_the_tf32_cores_rules():
    """fp32 split in tf32 halves (Device.tf32x3, on any machine): the tf32 cores' tiles with TF32X3 set, printed as
    such, gemm_ldsm.cl's where asked; never wgmma, whose operands come from shared memory unsplit; in tf32 none."""
    o = Options(fp32_tf32x3=True)
    x3 = Device("fake", False, True, "fp32", 132, 48 << 10, "gemm_core", mma=True, wgmma=True, tf32x3=True)
    pick = rules.pick_tiles(x3, o, 3152, 2304, 768)
    assert pick.core == "gemm_mma" and pick.tiles["TF32X3"] == 1 and pick.label.endswith("/3xtf32")
    assert pick.name == "tf32:wide"  # (not the huge tiles' warps of 4 x 8 blocks: rules.rule_shape)
    assert not rules.wgmma_product(x3, o, 4096, 3072, 768) and rules.wgmma_tiles(x3, o, 4096, 3072, 768) is None
    assert rules.ldsm_product(x3, o.replace(ldsm_min_rows=128), 4096, 3072, 768)
    assert rules.core_tiles(x3, o, rules.GEMM_TILES["ldsm_tf32"]["huge"], "gemm_ldsm")["TF32X3"] == 1
    assert "TF32X3" not in rules.core_tiles(x3, o, rules.GEMM_TILES["ldsm_f16"]["huge"], "gemm_ldsm")
    assert "TF32X3" not in rules.pick_tiles(FAKE_NVIDIA, o, 3152, 2304, 768).tiles


def test_ldsm_weights_stored_along_k():
    """On an NVIDIA device in tf32 mode with gemm_ldsm.cl on, a Linear layer of at least Options.ldsm_min_rows rows
    keeps its weight as [N, K] (transB=1) for it; a smaller one, or with the core off, as [K, N] (the rule, on any
    machine)."""
    from dlnet.graph.ir import Builder, Graph
    from dlnet.graph.passes.layout import pretranspose_weights

    def weight_layout(M, options):
        g = Graph()
        y = Builder(g).op("Gemm", [g.add_input("a", "float32", (M, 256)), g.constant(f32(256, 384))], {"transB": 0})
        pretranspose_weights(g, 32, lambda m, n, k: rules.ldsm_product(FAKE_NVIDIA, options, m, n, k))
        return y.producer.attrs["transB"], y.producer.inputs[1].shape

    assert weight_layout(512, Options(ldsm_min_rows=256)) == (1, (384, 256))
    assert weight_layout(200, Options(ldsm_min_rows=256)) == (0, (256, 384))
    assert weight_layout(512, Options(ldsm_min_rows=0)) == (0, (256, 384))


def test_tf32_weights_rounded_at_load():
    """On Hopper in tf32, a constant B [N, K] of a product wgmma takes is stored rounded to the nearest tf32 (what
    the tensor cores would make of it after mma_tf32.cl's TF32_BITS); a weight another node also reads keeps its
    values for that node. tf32() against rounding by the exponent's unit."""
    from dlnet.graph.ir import Builder, Graph
    from dlnet.graph.passes.layout import tf32, tf32_exact, tf32_weights

    x = np.concatenate([f32(1000) * 10.0 ** rng.integers(-30, 30, 1000), [1.0 + 2.0 ** -11, -(1.0 + 2.0 ** -11)]])
    x = x.astype(np.float32)
    ulp = 2.0 ** (np.floor(np.log2(np.abs(x.astype(np.float64)))) - 10)
    assert np.array_equal(tf32(x), (np.sign(x) * np.floor(np.abs(x) / ulp + 0.5) * ulp).astype(np.float32))
    assert tf32(x)[-2] == 1.0 + 2.0 ** -10 and tf32_exact(tf32(x)) and not tf32_exact(x)
    g = Graph()
    w = g.constant(f32(384, 256))
    a = g.add_input("a", "float32", (512, 256))
    y = Builder(g).op("Gemm", [a, w], {"transB": 1})
    z = Builder(g).op("Gemm", [g.add_input("b", "float32", (100, 256)), w], {"transB": 1})
    before = w.const.copy()
    assert tf32_weights(g, lambda m, n, k: (m, n, k) == (512, 384, 256))
    assert np.array_equal(y.producer.inputs[1].const, tf32(before)) and y.producer.inputs[1] is not w
    assert z.producer.inputs[1] is w and np.array_equal(w.const, before)
    assert not tf32_weights(g, lambda m, n, k: m == 512)  # (rounded once)


def test_wgmma_rules_and_ptx():
    """Hopper's wgmma: a device of compute capability 9 says so; the product needs half operands, 64 rows and columns
    and K, N multiples of 8; the WGMMA macro's operands; and the program's PTX for sm_90a: the marked comments
    become instructions and the target sm_90a, nothing else changes."""
    from dlnet.kernels.compile_worker import WGMMA_MARK, for_sm90a, sm90a_ptx
    from dlnet.kernels.device import compute_capability
    from dlnet.kernels.emitter import wgmma_macro

    class Hopper:
        compute_capability_major_nv = 9
    assert compute_capability(Hopper()) == 9 and compute_capability(object()) is None
    hopper = Device("fake", False, True, "fp16", 132, 48 << 10, "gemm_core", mma=True, wgmma=True)
    o = Options()
    for M, N, K in ((4096, 3072, 768), (64, 64, 8), (1000, 1000, 1000)):
        assert rules.wgmma_tiles(hopper, o, M, N, K) == rules.GEMM_TILES["wgmma_f16"]["huge"]
    for M, N, K, opts in ((32, 4096, 768, o), (4096, 3070, 768, o), (4096, 3072, 764, o),
                          (4096, 3072, 768, Options(wgmma=False))):
        assert rules.wgmma_tiles(hopper, opts, M, N, K) is None
    deep = rules.GEMM_TILES["wgmma_f16"]["deep"]  # (deep products, enough 128 x 256 tiles to fill the device)
    assert rules.wgmma_tiles(hopper, o, 4096, 4096, 4096) == deep and deep["TN"] == 256
    assert rules.wgmma_tiles(hopper, o, 1024, 4096, 4096) == rules.GEMM_TILES["wgmma_f16"]["huge"]  # (128 tiles)
    assert rules.wgmma_tiles(hopper, Options(wgmma_deep_k=8192), 4096, 4096, 4096)["TN"] == 128
    assert rules.wgmma_tiles(hopper, o, 4096, 4096, 4096, ("Gelu", ()))["TN"] == 128  # (f16 with an epilogue)
    tf32 = replace(hopper, precision="tf32")  # (float A and B where the tf32 tensor cores take the product)
    assert rules.wgmma_tiles(tf32, o, 4096, 3072, 764) == rules.GEMM_TILES["wgmma_tf32"]["huge"]
    assert rules.wgmma_tiles(tf32, o, 4096, 3072, 64) is None  # (o.tf32_fp32_k: shallow products stay fp32)
    assert rules.wgmma_tiles(replace(hopper, precision="fp32"), o, 4096, 3072, 768) is None
    assert rules.wgmma_tiles(replace(hopper, wgmma=False), o, 4096, 3072, 768) is None
    assert rules.wgmma_resident(rules.GEMM_TILES["wgmma_f16"]["huge"]) == 2  # (96 KiB of a unit's 228)
    assert rules.wgmma_resident(deep) == 1
    # split-K where the tiles are few and deep: a weight gradient's 768 x 2304 over 4096 tokens (108 tiles on 264
    # slots) in 2 slices, 768 x 768 (36) in 7, 3072 x 768 (144) in 5 (2.7 waves of whole slots)
    assert [rules.pick_splits(g, 264, 4096, k0=rules.WGMMA_K0) for g in (108, 36, 144)] == [2, 7, 5]
    macro = wgmma_macro(256)
    assert macro.count('"+f"') == 128 and "m64n256k16.f32.f16.f16 {%0," in macro and "%127}, %128, %129, p, 1" in macro
    assert "%65, p, 1, 1, 1, 0;" in wgmma_macro(128, trans_a=True) and "p, 1, 1, 0, 1;" in wgmma_macro(64, trans_b=True)
    assert "m64n128k8.f32.tf32.tf32 {%0," in wgmma_macro(128, True) and "%63}, %64, %65, p, 1, 1;" in wgmma_macro(128, True)
    ptx = (".version 9.0\n.target sm_90, texmode_independent\n{\n" + WGMMA_MARK + "wgmma.fence.sync.aligned;\n"
           "// a comment\n}\n").encode()
    assert sm90a_ptx(ptx) == (".version 9.0\n.target sm_90a, texmode_independent\n{\nwgmma.fence.sync.aligned;\n"
                              "// a comment\n}\n").encode()
    source = "__kernel void k(__global float* y) { y[0] = 1.0f; }"
    prg = cl.Program(context().cl, source).build()
    assert for_sm90a(prg, source, []) is prg  # (a program without the mark is left as it was built)
