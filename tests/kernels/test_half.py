"""precision="fp16": the half-storage pass (graph/passes/half.py), the kernels' half I/O (kernels/half.py) and the
error against the fp32 run of the same model. Every model test asserts that values really are stored in half (f16
in the IR, fewer planned bytes), so a pass that stores nothing fails."""
import os

import numpy as np
import onnx
import pytest
from onnx import helper

import dlnet
from dlnet.errors import DeviceError
from dlnet.graph.parser import constants_of, graphs_equal, parse_graph
from dlnet.graph.passes import run_passes
from dlnet.graph.passes.half import store_half
from dlnet.images import preprocess, read_image
from dlnet.kernels import half
from dlnet.onnx.importer import Importer
from tests.conftest import context, make_model, rel_l2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS = os.path.join(ROOT, "models", "digits.onnx")
DIGITS_DIR = os.path.join(ROOT, "models", "digits")
# the test device's own kernels, and the GPU kernels (gemm_core.cl, conv.cl, dwconv.cl, gemv.cl, attention.cl) forced
# onto it as a GPU runs them (tests/kernels/test_dwconv_gpu.py's way)
CORES = ["native", "gpu"]
# the GPU kernels on PoCL take seconds a model on 2 cores: CI runs those once, with the slow cases
CORES_SLOW_GPU = ["native", pytest.param("gpu", marks=pytest.mark.slow)]
_CONTEXTS = {}


def contexts(core):
    """(fp32, fp16) Contexts on the test device, as it is or taken for a GPU (made once); "winograd": the GPU's with
    Winograd for every 3x3 layer it can take."""
    if core not in _CONTEXTS:
        base = context()
        base.queue  # (the device opened before a second Context looks for it)
        # (fp16_mma off: on NVIDIA the tensor cores keep convolutions' x and w in float32; these tests check the
        # kernels' half I/O, which test_fp16_on_nvidias_tensor_cores checks there)
        options = base.options.replace(input_chunks=1, fp16_mma=False)
        if core == "winograd":
            options = options.replace(winograd_min_channels=1, winograd_min_layer_tiles=0, winograd_m=4,
                                      winograd_f4_min_tiles=32)  # (the first layer F(4x4), the second F(2x2))
        c32, c16 = base.with_options(options), dlnet.Context(base.info, precision="fp16", options=options)
        if core != "native":
            c32.is_cpu = c16.is_cpu = False
            assert c32.dev.kind == c16.dev.kind == "gpu"
        _CONTEXTS[core] = (c32, c16)
    return _CONTEXTS[core]


def _rng(seed):
    return np.random.default_rng(seed)


def small_cnn():
    """Conv-BatchNorm-Relu, MaxPool, Conv-BatchNorm-Relu with a residual Add, a depthwise Conv-Relu,
    GlobalAveragePool, Flatten, Gemm, Softmax: BatchNorm folds into the convolutions, their epilogues fuse."""
    r = _rng(0)
    w = lambda *s: (r.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    bn = lambda c, p: {f"{p}_s": (r.random(c) + 0.5).astype(np.float32), f"{p}_b": w(c),  # noqa: E731
                       f"{p}_m": w(c), f"{p}_v": (r.random(c) + 0.5).astype(np.float32)}
    inits = {"w1": w(8, 3, 3, 3), "w2": w(8, 8, 3, 3), "wd": w(8, 1, 3, 3), "fw": w(8, 10) * 0.3, "fb": w(10),
             **bn(8, "bn1"), **bn(8, "bn2")}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn1_s", "bn1_b", "bn1_m", "bn1_v"], ["b1"]),
        helper.make_node("Relu", ["b1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c2", "bn2_s", "bn2_b", "bn2_m", "bn2_v"], ["b2"]),
        helper.make_node("Add", ["b2", "p1"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("Conv", ["r2", "wd"], ["d3"], pads=[1, 1, 1, 1], group=8),
        helper.make_node("Relu", ["d3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1),
    ]
    # (the pooled features are an output too: float32 from the reduction anyway, and a change in any layer shows in
    # them where the softmax may hide it)
    return make_model(nodes, {"x": ("float32", [4, 3, 16, 16])}, ["y", "g"], inits)


def _halves(net):
    """The values the last plan stores in half."""
    return [v for v in net.graph.values() if v.dtype == "float16"]


def _planned_bytes(net):
    """Weight bytes and activation bytes at one buffer per value (what each value takes: the packed arena may not
    shrink where its peak is a float32 value)."""
    m = net.memory
    return m.naive_activations + m.weights


def _compare(model, feeds, core, tol=1e-2):
    """(fp32 outputs, fp16 outputs, fp32 net, fp16 net) of `model` on the contexts of `core`."""
    c32, c16 = contexts(core)
    n32 = dlnet.Net(c32).load_onnx(model)
    n16 = dlnet.Net(c16).load_onnx(model)
    y32, y16 = n32.run(feeds), n16.run(feeds)
    for name in y32:
        assert y16[name].dtype == y32[name].dtype  # (the user sees float32 either way)
        assert rel_l2(y16[name], y32[name]) <= tol, (name, rel_l2(y16[name], y32[name]))
    return y32, y16, n32, n16


# --- the pass, on the graph alone ---------------------------------------------------------------------------------

def _graph(model, shapes):
    return run_passes(Importer(model).build(shapes))


def test_pass_stores_half_only_where_writer_and_every_reader_take_it():
    graph = _graph(small_cnn(), {"x": (4, 3, 16, 16)})
    before = {v.id: v.dtype for v in graph.values()}
    convs = [n for n in graph.nodes if n.op == "Conv"]
    blocked = convs[1]  # its kernel takes nothing in half: its input, weights and output stay float32

    def io(node):
        return half.NONE if node is blocked else half.EVERY if node.op != "Softmax" else half.READS
    count = store_half(graph, io)
    graph.verify()
    stored = {v.id for v in graph.values() if v.dtype == "float16"}
    assert count == len(stored) > 0
    assert all(v.dtype == "float32" for v in graph.inputs + graph.outputs)  # the boundary stays float32
    assert all(v.dtype == "float32" for v in blocked.inputs + blocked.outputs if v is not None)
    w1 = convs[0].inputs[1]
    assert w1.dtype == "float16" and w1.const.dtype == np.float16  # a weight read only in half is uploaded so
    softmax = next(n for n in graph.nodes if n.op == "Softmax")
    assert softmax.inputs[0].dtype == "float16"  # half in, float32 out (the graph's output)
    assert all(before[i] == "float32" for i in stored)
    assert "fp16:" in str(graph)


def test_pass_keeps_a_view_and_its_input_alike():
    graph = _graph(small_cnn(), {"x": (4, 3, 16, 16)})
    flatten = next(n for n in graph.nodes if n.spec.kind == "alias")
    gemm = next(n for n in graph.nodes if n.op == "Gemm")
    store_half(graph, lambda node: half.HalfIO((1, 2), True) if node is gemm else half.EVERY)
    assert flatten.inputs[0].dtype == flatten.outputs[0].dtype == "float32"  # the Gemm reads the view in float32
    assert gemm.inputs[1].dtype == "float16"


def test_products_of_a_graph_input_read_a_half_copy():
    """half_input_copies: a float32 graph input that a product on a half core reads in half is read through one Cast
    copy, which store_half stores in half (the input itself stays float32); a product the rule rejects, and a node
    of another op, read the input as it is."""
    from dlnet.graph.ir import Builder, Graph
    from dlnet.graph.passes.half import half_input_copies
    g = Graph()
    x = g.add_input("x", "float32", (256, 64))
    r = np.random.default_rng(3)
    big = Builder(g).op("Gemm", [x, g.constant(r.standard_normal((64, 128)).astype(np.float32))], {})
    small = Builder(g).op("Gemm", [x, g.constant(r.standard_normal((64, 8)).astype(np.float32))], {})
    act = Builder(g).op("Relu", [x])
    g.outputs.extend([big, small, act])
    assert half_input_copies(g, lambda node: half.EVERY, lambda node: node.outputs[0].shape[1] >= 64) == 1
    copy = big.producer.inputs[0]
    assert copy is not x and copy.producer.op == "Cast" and small.producer.inputs[0] is x and act.producer.inputs[0] is x
    g.verify()
    store_half(g, lambda node: half.EVERY)
    assert copy.dtype == "float16" and x.dtype == "float32"


def test_pass_does_nothing_where_no_kernel_takes_half():
    graph = _graph(small_cnn(), {"x": (4, 3, 16, 16)})
    assert store_half(graph, lambda node: half.NONE) == 0
    assert all(v.dtype != "float16" for v in graph.values())


# --- the device --------------------------------------------------------------------------------------------------

def test_precision_names_fp16():
    with pytest.raises(DeviceError, match="'fp32', 'tf32' or 'fp16'"):
        dlnet.Context(precision="fp8")


def test_a_device_without_half_io_is_a_device_error(monkeypatch):
    _, c16 = contexts("native")
    monkeypatch.setattr(half, "_CHECKED", {})
    monkeypatch.setattr(half, "_probe", lambda ctx: "vload_half does not build")
    with pytest.raises(DeviceError, match="precision 'fp16' on .*vload_half does not build"):
        dlnet.Net(c16).load_onnx(small_cnn()).run({"x": _rng(1).standard_normal((4, 3, 16, 16), np.float32)})


def test_the_probe_passes_on_the_test_device():
    assert half._probe(context()) == ""


# --- models against their fp32 runs ------------------------------------------------------------------------------

@pytest.mark.parametrize("core", CORES_SLOW_GPU + ["winograd"])
def test_small_cnn_with_batchnorm(core):
    x = _rng(2).standard_normal((4, 3, 16, 16), np.float32)
    _, _, n32, n16 = _compare(small_cnn(), {"x": x}, core)
    assert _halves(n16)
    gemm = next(n for n in n16.graph.nodes if n.op == "Gemm")  # (gemm_cpu.cl, gemv.cl)
    assert gemm.outputs[0].dtype == "float16"  # Softmax reads it in half and writes the float32 output
    if core == "gpu":  # the implicit-GEMM and depthwise convolutions read and write half, weights included
        assert _planned_bytes(n16) < _planned_bytes(n32)
        conv = {n.schedule["algo"]: n for n in n16.graph.nodes if n.op == "Conv"}
        assert {"implicit_gemm", "depthwise"} <= set(conv)
        assert all(v.dtype == "float16" for n in conv.values() for v in n.inputs[1:2] + n.outputs)
        assert conv["depthwise"].inputs[0].dtype == "float16"
    if core == "winograd":  # winograd.cl's transforms read x and write y in half, the GEMM reads U in half
        wino = [n for n in n16.graph.nodes if n.op == "Conv" and n.schedule["algo"].startswith("winograd")]
        assert [n.schedule["algo"] for n in wino] == ["winograd4", "winograd2"]
        assert all(v.dtype == "float16" for v in wino[0].inputs[1:2] + wino[0].outputs)
        assert wino[1].inputs[0].dtype == "float16"


@pytest.mark.parametrize("core", CORES)
def test_pooling_between_half_values(core):
    """Relu -> MaxPool -> AveragePool -> Flatten -> Gemm: the pools read and write half (pool_cpu.cl, pool.cl)."""
    r = _rng(4)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["m"], ["a"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["a"], ["f"]),
             helper.make_node("Gemm", ["f", "w"], ["y"])]
    model = make_model(nodes, {"x": ("float32", [3, 4, 12, 12])}, ["y"],
                       {"w": (r.standard_normal((144, 5)) * 0.1).astype(np.float32)})
    _, _, _, n16 = _compare(model, {"x": r.standard_normal((3, 4, 12, 12), np.float32)}, core)
    pools = [n for n in n16.graph.nodes if n.op in ("MaxPool", "AveragePool")]
    assert len(pools) == 2 and all(v.dtype == "float16" for n in pools for v in n.inputs + n.outputs)


@pytest.mark.parametrize("core", CORES_SLOW_GPU)
@pytest.mark.parametrize("back", [False, True], ids=["channels-last", "nchw"])
def test_layernorm_over_channels_in_half(core, back):
    """ConvNeXt's LayerNorm over NCHW's channels (Transpose -> LayerNorm [-> Transpose back]: one LayerNormAxis,
    layernorm_axis.cl) reads its input and writes its output in half, as LayerNorm does, so the product after it
    reads half A too; its statistics stay float."""
    r = _rng(9)
    nodes = [helper.make_node("Conv", ["x", "wc"], ["c"]), helper.make_node("Relu", ["c"], ["a"]),
             helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "s", "b"], ["n"], axis=-1, epsilon=1e-6)]
    inits = {"wc": (r.standard_normal((24, 16, 1, 1)) / 4).astype(np.float32),
             "s": (1 + 0.1 * r.standard_normal(24)).astype(np.float32),
             "b": (0.1 * r.standard_normal(24)).astype(np.float32)}
    if back:  # LayerNorm2d: NCHW again, then Flatten -> Gemm
        nodes += [helper.make_node("Transpose", ["n"], ["nb"], perm=[0, 3, 1, 2]),
                  helper.make_node("Flatten", ["nb"], ["f"]), helper.make_node("Gemm", ["f", "wg"], ["y"])]
        inits["wg"] = (r.standard_normal((24 * 30, 10)) / 27).astype(np.float32)
    else:  # channels-last into a Linear layer (ConvNeXt's block)
        nodes.append(helper.make_node("MatMul", ["n", "wg"], ["y"]))
        inits["wg"] = (r.standard_normal((24, 10)) / 5).astype(np.float32)
    model = make_model(nodes, {"x": ("float32", [2, 16, 5, 6])}, ["y"], inits, opset=17)
    _, _, _, n16 = _compare(model, {"x": r.standard_normal((2, 16, 5, 6), np.float32)}, core)
    ln = next(n for n in n16.graph.nodes if n.op == "LayerNormAxis")
    assert ln.outputs[0].dtype == "float16"
    # (conv_cpu.cl writes float32; the GPU convolutions write half)
    assert ln.inputs[0].dtype == ("float32" if contexts(core)[1].is_cpu else "float16")


def _transformer(name):
    pytest.importorskip("torch")
    from tests.onnx.test_transformers import _model
    data, make_input, shape, _ = _model(name)
    return onnx.load_from_string(data), {"x": make_input(shape, 3)}


@pytest.mark.parametrize("core", CORES_SLOW_GPU)
@pytest.mark.parametrize("name", ["encoder", "vit", "causal_decoder"])  # BERT-, ViT- and GPT-shaped
def test_transformers(name, core):
    model, feeds = _transformer(name)
    _, _, n32, n16 = _compare(model, feeds, core)
    stored = _halves(n16)
    assert len(stored) >= 5 and _planned_bytes(n16) < _planned_bytes(n32)
    gemms = [n for n in n16.graph.nodes if n.op == "Gemm"]
    assert any(n.outputs[0].dtype == "float16" for n in gemms)
    assert any(n.inputs[0].dtype == "float16" for n in gemms)
    if name != "vit":  # the token embedding: a half table gathered into half rows (gather.cl)
        gather = next(n for n in n16.graph.nodes if n.op == "Gather")
        assert gather.inputs[0].dtype == gather.outputs[0].dtype == "float16"
    attention = [n for n in n16.graph.nodes if n.op == "Attention"]  # (attention_cpu.cl, attention.cl)
    assert attention and all(v.dtype == "float16" for n in attention for v in n.inputs[:3] + n.outputs)
    text = str(n16.graph)  # the printed IR reads back as the same graph, f16 values and all
    assert " f16[" in text or ": f16[" in text
    assert graphs_equal(parse_graph(text, constants_of(n16.graph)), n16.graph) == (True, "")


@pytest.mark.parametrize("core", CORES_SLOW_GPU)
def test_digits_same_top1_on_the_shipped_images(core):
    files = sorted(os.path.join(DIGITS_DIR, f) for f in os.listdir(DIGITS_DIR))
    model = onnx.load(DIGITS)
    x = np.stack([preprocess(read_image(f), (16, 16), None, 1) for f in files])  # (as `dlnet infer` does)
    y32, y16, n32, n16 = _compare(model, {model.graph.input[0].name: x}, core)
    out = model.graph.output[0].name
    assert (y16[out].argmax(1) == y32[out].argmax(1)).all()
    assert (y32[out].argmax(1) == [int(os.path.basename(f)[0]) for f in files]).all()  # (the true classes)
    assert _halves(n16) and _planned_bytes(n16) < _planned_bytes(n32)


def test_infer_precision_fp16_classifies_as_fp32():
    """`dlnet infer --precision fp16` on the shipped digits: the classes of fp32, scores within 1e-2."""
    from click.testing import CliRunner
    from dlnet.cli import main as cli_main

    from tests.cli.test_infer import parse_csv
    runner = CliRunner()
    fp32 = parse_csv(runner.invoke(cli_main.cli, ["infer", DIGITS, DIGITS_DIR]).stdout)
    r = runner.invoke(cli_main.cli, ["infer", DIGITS, DIGITS_DIR, "--precision", "fp16"])
    assert r.exit_code == 0, r.output
    fp16 = parse_csv(r.stdout)
    assert len(fp16) == 10 and [(p, k) for p, [(k, _, _)] in fp16] == [(p, k) for p, [(k, _, _)] in fp32]
    for (_, [(_, _, a)]), (_, [(_, _, b)]) in zip(fp16, fp32):
        assert abs(a - b) < 1e-2


def test_half_operands_leave_the_cp_async_pipeline():
    """NVIDIA's fp32 core copies floats with cp.async (STAGES): a half A / B / x / w takes the register path."""
    tiles = dict(TM=64, TN=64, TK=16, WM=4, WN=4, STAGES=3)
    assert "STAGES" not in half.without_copies(tiles, {"A_HALF": 1}, ("A", "B"))
    assert "STAGES" not in half.without_copies(tiles, {"W_HALF": 1}, ("X", "W"))
    assert half.without_copies(tiles, {"Y_HALF": 1, "C_HALF": 1}, ("A", "B")) == tiles  # (the epilogue's: kept)
    assert half.without_copies(tiles, None, ("A", "B")) == tiles


@pytest.mark.parametrize("cache", ["growing", "where"])
def test_greedy_decoding_keeps_torch_tokens(cache):
    """dlnet.generate in fp16 with a decoder's cache kept on the device (concatenated, or written in place over the
    past by a Where): torch's greedy tokens, with values stored in half inside the graph (the cache itself crosses
    the graph's boundary, so it stays float32)."""
    pytest.importorskip("torch")
    import torch

    from tests import test_generate as gen
    torch.manual_seed(0)
    growing = gen.Decoder().eval()
    model = growing if cache == "growing" else gen.Decoder(cache).eval()
    model.load_state_dict(growing.state_dict())
    ids = gen.prompt(batch=2 if cache == "growing" else 1)
    _, c16 = contexts("native")
    with dlnet.Net(c16).load_onnx(gen.export(model)) as net:
        got = dlnet.generate(net, ids, 12)
        assert _halves(net)
    np.testing.assert_array_equal(got, gen.torch_greedy(growing, ids, 12))


@pytest.mark.parametrize("M,K,N,trans_b", [(300, 256, 264, 0), (1000, 768, 1024, 0), (40, 64, 72, 1),
                                           (2100, 328, 1032, 1), (2100, 24, 1040, 0)])
def test_tensor_core_products_in_half(M, K, N, trans_b):
    """On NVIDIA in fp16, products of half A and B run on gemm_ldsm.cl's f16 core (mma.sync m16n8k16, B [K, N] by
    ldmatrix.trans or [N, K]), or on Hopper gemm_wgmma.cl (B stored [N, K]): a Linear layer between two pointwise ops
    (so that its input and output are stored in half), ragged M, against float64 within half's rounding. The
    2100-row products fill an H100's or H200's units with 128 x 128 tiles of gemm_ldsm.cl (its fragments
    double-buffered, LDSM_PIPE): a last partial slice of K, and K in one."""
    ctx = context()
    if not ctx.is_nvidia:
        pytest.skip("gemm_ldsm.cl needs an NVIDIA device (inline PTX mma.sync)")
    r = _rng(M)
    x, w, bias = (r.standard_normal((M, K)).astype(np.float32), (r.standard_normal((N, K) if trans_b else (K, N)) /
                  np.sqrt(K)).astype(np.float32), r.standard_normal(N).astype(np.float32))
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Gemm", ["a", "w", "b"], ["p"], transB=trans_b),
             helper.make_node("Tanh", ["p"], ["y"])]
    net = dlnet.Net(dlnet.Context(ctx.info, precision="fp16")).load_onnx(make_model(nodes, {"x": x}, ["y"],
                                                                                   {"w": w, "b": bias}))
    y = net.run({"x": x})["y"]
    wf = w.astype(np.float64).T if trans_b else w.astype(np.float64)
    ref = np.tanh(np.maximum(x.astype(np.float64), 0) @ wf + bias)
    assert "ldsm_f16" in str(net.graph) or net.ctx.dev.wgmma and "wgmma" in str(net.graph)
    assert rel_l2(y, ref) < 5e-3


@pytest.mark.parametrize("M,K,N,trans_b", [(768, 4096, 3072, 0), (264, 1000, 200, 0), (72, 200, 40, 1),
                                           (1032, 2100, 328, 0)])
def test_weight_gradient_products_in_half(M, K, N, trans_b):
    """On NVIDIA in fp16, a product whose A is stored [K, M] (transA: a weight gradient, activations transposed times
    the output's gradient, both stored in half) runs on gemm_ldsm.cl's f16 core, A read by ldmatrix.trans, not on the
    register-staged float core: ragged M, N and K (a last partial slice), B [K, N] or [N, K], against float64."""
    ctx = context()
    if not ctx.is_nvidia:
        pytest.skip("gemm_ldsm.cl needs an NVIDIA device (inline PTX mma.sync)")
    r = _rng(M + N)
    x, z = r.standard_normal((K, M)).astype(np.float32), r.standard_normal((N, K) if trans_b else (K, N))
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Tanh", ["z"], ["b"]),
             helper.make_node("Gemm", ["a", "b"], ["p"], transA=1, transB=trans_b, alpha=1 / K),
             helper.make_node("Tanh", ["p"], ["y"])]
    z = z.astype(np.float32)
    net = dlnet.Net(dlnet.Context(ctx.info, precision="fp16")).load_onnx(make_model(nodes, {"x": x, "z": z}, ["y"]))
    y = net.run({"x": x, "z": z})["y"]
    zf = np.tanh(z.astype(np.float64))
    ref = np.tanh(np.maximum(x.astype(np.float64), 0).T @ (zf.T if trans_b else zf) / K)
    assert "ldsm_f16" in str(net.graph) or net.ctx.dev.wgmma and "wgmma" in str(net.graph)
    assert rel_l2(y, ref) < 5e-3


@pytest.mark.parametrize("M,K,N,trans_a,trans_b", [(264, 1000, 200, 1, 0), (1000, 512, 520, 0, 0),
                                                   (520, 336, 1032, 1, 1), (2048, 2048, 4096, 1, 0),
                                                   (72, 4104, 136, 1, 0), (256, 4096, 256, 0, 1)])
def test_wgmma_transposed_operands(M, K, N, trans_a, trans_b):
    """On Hopper in fp16, products of two activations with A stored [K, M] (transA: a weight gradient) or B stored
    [K, N] (a weight's gradient or a product by a weight read as stored) run on gemm_wgmma.cl with wgmma's transposed
    (MN-major) operands, Options.wgmma_mn: ragged rows, columns and depth (K not a multiple of a slice's 64), the deep
    128 x 256 tile (no epilogue), K split over work-groups where the tiles are few (Options.wgmma_split_k on;
    slices left empty too), against float64; with wgmma_mn and wgmma_split_k off they run on gemm_ldsm.cl or whole and
    agree."""
    ctx = context()
    c16 = dlnet.Context(ctx.info, precision="fp16")
    if not c16.dev.wgmma:
        pytest.skip("gemm_wgmma.cl needs an NVIDIA Hopper GPU")
    r = _rng(M + 3 * N + K)
    x = r.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
    z = r.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Tanh", ["z"], ["b"]),
             helper.make_node("Gemm", ["a", "b"], ["y"], transA=trans_a, transB=trans_b, alpha=1 / np.sqrt(K))]
    model = make_model(nodes, {"x": x, "z": z}, ["y"])
    a, b = np.maximum(x.astype(np.float64), 0), np.tanh(z.astype(np.float64))
    ref = (a.T if trans_a else a) @ (b.T if trans_b else b) / np.sqrt(K)
    net = dlnet.Net(c16.with_options(wgmma_split_k=2048)).load_onnx(model)
    y = net.run({"x": x, "z": z})["y"]
    assert ("wgmma128x256" if M == 2048 else "wgmma128x128") in str(net.graph)
    assert ("splitK" in " ".join(launch.label for launch in net.launches)) == (K >= 4096)
    assert rel_l2(y, ref) < 5e-3
    off = dlnet.Net(c16.with_options(wgmma_mn=False, wgmma_split_k=0)).load_onnx(model)
    assert ("wgmma" in str(off.graph)) == ((trans_a, trans_b) == (0, 1))
    assert rel_l2(y, off.run({"x": x, "z": z})["y"]) < 2e-3


@pytest.mark.parametrize("M,K,N,trans_b", [(4200, 520, 2064, 0), (2100, 328, 1032, 1), (300, 40, 136, 0),
                                            (2100, 2056, 2064, 1)])
def test_wgmma_products_in_half(M, K, N, trans_b):
    """On Hopper in fp16, products of half A and B run on gemm_wgmma.cl (wgmma, PTX for sm_90a): rows, columns and
    depth ragged (K a multiple of 8, not of the 64 of a slice; one slice), a weight given [K, N] and stored [N, K] at
    load, a bias and a fused Relu, in half, against float64; the same layer with Options.wgmma off runs on
    gemm_ldsm.cl and agrees."""
    ctx = context()
    c16 = dlnet.Context(ctx.info, precision="fp16")
    if not c16.dev.wgmma:
        pytest.skip("gemm_wgmma.cl needs an NVIDIA Hopper GPU")
    r = _rng(M + K)
    x, w, bias = (r.standard_normal((M, K)).astype(np.float32), (r.standard_normal((N, K) if trans_b else (K, N)) /
                  np.sqrt(K)).astype(np.float32), r.standard_normal(N).astype(np.float32))
    nodes = [helper.make_node("Tanh", ["x"], ["a"]), helper.make_node("Gemm", ["a", "w", "b"], ["p"], transB=trans_b),
             helper.make_node("Relu", ["p"], ["q"]), helper.make_node("Tanh", ["q"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"w": w, "b": bias})
    wf = w.astype(np.float64).T if trans_b else w.astype(np.float64)
    ref = np.tanh(np.maximum(np.tanh(x.astype(np.float64)) @ wf + bias, 0))
    net = dlnet.Net(c16).load_onnx(model)
    y = net.run({"x": x})["y"]
    assert "wgmma128x128" in str(net.graph)  # (deep ones too: with the Relu epilogue, f16 keeps 128 x 128)
    assert rel_l2(y, ref) < 5e-3
    off = dlnet.Net(c16.with_options(wgmma=False)).load_onnx(model)
    assert "wgmma" not in str(off.graph)
    assert rel_l2(y, off.run({"x": x})["y"]) < 2e-3
    # the tile stored through __local memory in runs of 8 columns (N a multiple of 8) or as fragments: the same values
    frags = dlnet.Net(c16.with_options(wgmma_staged_y=False)).load_onnx(model)
    assert "/y8" in str(net.graph) and "/y8" not in str(frags.graph)
    assert rel_l2(y, frags.run({"x": x})["y"]) == 0.0


def test_products_of_an_input_on_wgmma():
    """On Hopper in fp16, a Linear layer right on the graph's (float32) input reads a half copy of it and runs on
    wgmma (not the float core): against float64."""
    ctx = context()
    c16 = dlnet.Context(ctx.info, precision="fp16")
    if not c16.dev.wgmma:
        pytest.skip("gemm_wgmma.cl needs an NVIDIA Hopper GPU")
    r = _rng(11)
    x, w = r.standard_normal((1000, 256)).astype(np.float32), (r.standard_normal((256, 512)) / 16).astype(np.float32)
    net = dlnet.Net(c16).load_onnx(make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": x}, ["y"],
                                              {"w": w}))
    y = net.run({"x": x})["y"]
    assert "wgmma128x128" in str(net.graph) and "Cast" in str(net.graph)
    assert rel_l2(y, x.astype(np.float64) @ w) < 5e-3


@pytest.mark.parametrize("mma", [True, False])
def test_fp16_on_nvidias_tensor_cores(mma):
    """NVIDIA, precision "fp16" (Options.fp16_mma): convolutions (implicit GEMM, a 1x1 and a strided 3x3) run on the
    tf32 tensor cores with x and w in float32 (their cp.async pipeline) and write half; a product of half operands
    that gemm_ldsm.cl does not take (N not whole 16-byte rows) runs there too, through registers (half is exact in
    tf32). fp16_mma=False: all on the fp32 core, x and w in half. Both against float64."""
    base = context()
    if not base.is_nvidia:
        pytest.skip("the tf32 core needs an NVIDIA device (inline PTX mma.sync)")
    r = _rng(7)
    x = r.standard_normal((2, 256, 15, 15)).astype(np.float32)  # (depths 32-95 stay fp32: tf32_fp32_k)
    w1 = (r.standard_normal((96, 256, 1, 1)) / 16).astype(np.float32)
    w3 = (r.standard_normal((256, 96, 3, 3)) / 30).astype(np.float32)
    wg = (r.standard_normal((256, 90)) / 16).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w3"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["d"]), helper.make_node("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["t", "shape"], ["f"]), helper.make_node("MatMul", ["f", "wg"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"w1": w1, "w3": w3, "wg": wg,
                                                 "shape": np.array([128, 256], np.int64)})
    ctx = dlnet.Context(base.info, precision="fp16", options=base.options.replace(input_chunks=1, fp16_mma=mma))
    net = dlnet.Net(ctx).load_onnx(model)
    y = net.run({"x": x})["y"]
    a = np.maximum(np.einsum("kc,nchw->nkhw", w1[:, :, 0, 0].astype(np.float64), x), 0)
    ap = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1)))
    c = sum(np.einsum("nchw,kc->nkhw", ap[:, :, i:i + 15:2, j:j + 15:2], w3[:, :, i, j].astype(np.float64))
            for i in range(3) for j in range(3))
    want = np.maximum(c, 0).transpose(0, 2, 3, 1).reshape(128, 256) @ wg
    assert rel_l2(y, want) < 3e-3
    convs = [n for n in net.graph.nodes if n.op == "Conv"]
    assert len(convs) == 2 and convs[1].inputs[0].dtype == ("float32" if mma else "float16")
    assert convs[1].inputs[1].dtype == ("float32" if mma else "float16") and convs[1].outputs[0].dtype == "float16"
    gemm = next(n for n in net.graph.nodes if n.op == "Gemm")
    assert gemm.inputs[0].dtype == "float16"
    tiles = [launch.tile[1] for launch in net.launches if launch.tile and launch.layer.split(" ")[-1] in
             ("Conv", "Gemm")]
    assert len(tiles) >= 3 and all(t.startswith("tf32:" if mma else "gpu:") for t in tiles), tiles
