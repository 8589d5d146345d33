"""The transformer fusions of graph/passes/transformer.py, on the CPU device and with the GPU kernels forced onto it:

- a residual Add and the LayerNorm / RMSNorm after it run as one AddLayerNorm kernel, writing the sum too where the
  residual stream reads it (pre-LN GPT / ViT blocks) and not where nothing else does (post-LN BERT blocks, the final
  norm); LayerNormalization-17 and RMSNormalization-23 (through their handlers' Reshape views) and a position table
  broadcast over the batch included; a bias-free projection keeps the residual Add as its Gemm's C instead;
- the Q, K and V projections of one input run as one Gemm by weights concatenated at load, whose column blocks the
  Attention kernels read in place (ColumnView); a projection read by anything else stays unfused.
Against onnxruntime (the exported models) or onnx.reference (the hand-built graphs) by relative L2 error.
"""
import io

import numpy as np
import onnx
import pytest
from onnx import helper

import dlnet
from dlnet.graph.ops.transformer import view_strides
from dlnet.graph.parser import constants_of, graphs_equal, parse_graph

from ..conftest import context, make_model, reference, rel_l2
from .test_rms_rotary import model_of

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
tt = pytest.importorskip("tests.onnx.test_transformers")  # (its builders need torch)
nn = torch.nn

rng = np.random.default_rng(28)


def gpu_like():
    """The CPU context taking its device for a GPU (tests/kernels/test_dwconv_gpu.py): the GPU kernels on PoCL."""
    ctx = context().with_options(input_chunks=1)
    ctx.is_cpu = False
    assert ctx.dev.kind == "gpu"
    return ctx


class PostNormBlock(nn.Module):
    """BERT's post-norm block: ln1(x + attn(x)), then ln2(x + mlp(x)): each sum is read by its LayerNorm alone."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(tt.D), nn.LayerNorm(tt.D)
        self.attn = tt.SelfAttention()
        self.mlp = nn.Sequential(nn.Linear(tt.D, tt.FF), nn.GELU(), nn.Linear(tt.FF, tt.D))

    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(tt.VOCAB, tt.D), nn.Embedding(tt.MAX_POS, tt.D)
        self.ln = nn.LayerNorm(tt.D)
        self.blocks = nn.Sequential(PostNormBlock(), PostNormBlock())

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        return self.blocks(self.ln(self.tok(ids) + self.pos(pos)))


MODELS = {  # name: (export, sums kept for the residual stream, AddLayerNorms, Gemms of a head)
    "gpt": ("causal_decoder", 4, 5, 1),  # pre-LN: ln1, ln2 of each block keep the sum; the final one does not
    "vit": ("vit", 4, 5, 1),
    "bert": ("bert", 0, 5, 0),  # post-LN: the embeddings' LayerNorm and both of each block; no sum is read again
}


def _exported(name):
    if name == "bert":
        torch.manual_seed(0)
        module = tt._randomise_norms(Bert())
        data = tt._export(module, torch.from_numpy(tt._tokens((2, 9), 0)), {0: "batch", 1: "seq"})
        return data, tt._tokens, (2, 9), (3, 6)
    return tt._model(name)


def _check_fused(net, kept, fused, heads):
    ops = [n.op for n in net.graph.nodes]
    assert ops.count("AddLayerNorm") == fused and "LayerNorm" not in ops and "Add" not in ops, ops
    assert sum(n.attrs["keep_sum"] for n in net.graph.nodes if n.op == "AddLayerNorm") == kept
    # one product per block for q, k and v: [*, D] x [D, 3D], its three column blocks read by the block's Attention
    # (stored [3D, D] where a GPU's gemv reads it)
    both = ((tt.D, 3 * tt.D), (3 * tt.D, tt.D))
    packed = [n for n in net.graph.nodes if n.op == "Gemm" and n.inputs[1].shape in both]
    # the others: the output projection and the MLP's two of each block, the head
    assert len(packed) == 2 and ops.count("ColumnView") == 6 and ops.count("Gemm") == 2 + 3 * 2 + heads
    for n in net.graph.nodes:
        if n.op == "Attention":
            assert [x.producer.op for x in n.inputs[:3]] == ["ColumnView"] * 3
            assert sorted(x.producer.attrs["start"] for x in n.inputs[:3]) == [0, tt.D, 2 * tt.D]
    text = str(net.graph)
    assert text.count("= AddLayerNorm(") == fused and text.count("= ColumnView(") == 6
    assert graphs_equal(parse_graph(text, constants_of(net.graph)), net.graph) == (True, "")  # the IR reads back


def _run(name, ctx):
    export, kept, fused, heads = MODELS[name]
    data, make_input, shape, shape2 = _exported(export)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    net = dlnet.Net(ctx).load_onnx(onnx.load_from_string(data))
    for seed, s in ((1, shape), (2, shape2)):
        feeds = {"x": make_input(s, seed)}
        got, want = net.run(feeds)["y"], sess.run(None, feeds)[0]
        assert got.shape == want.shape and rel_l2(got, want) <= 1e-4, rel_l2(got, want)
        _check_fused(net, kept, fused, heads)
    net.release()


@pytest.mark.parametrize("name", list(MODELS))
def test_fused_transformer_matches_onnxruntime(name):
    _run(name, context())


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_fused_transformer_with_gpu_kernels(name):
    _run(name, gpu_like())


# ------------------------------------------------------------------ hand-built graphs, onnx.reference ---------------
def _norm_nodes(kind, s, y):
    if kind == "layernorm17":
        return [helper.make_node("LayerNormalization", [s, "scale", "bias"], [y], epsilon=1e-3)]
    return [helper.make_node("RMSNormalization", [s, "scale"], [y], epsilon=1e-3)]


CASES = {  # name: (norm, b's shape, the sum read again)
    "layernorm17-residual": ("layernorm17", (2, 5, 48), True),
    "layernorm17-position-table": ("layernorm17", (1, 5, 48), True),
    "rmsnorm23-residual": ("rmsnorm23", (2, 5, 48), True),
    "rmsnorm23-alone": ("rmsnorm23", (5, 48), False),
    "layernorm17-sum-is-an-output": ("layernorm17", (2, 5, 48), "output"),
    "layernorm17-d45-residual": ("layernorm17", (2, 5, 45), True),  # (rows of no whole number of 8-float chunks)
    "rmsnorm23-d29-sum-is-an-output": ("rmsnorm23", (2, 5, 29), "output"),
}


@pytest.mark.parametrize("gpu", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("case", list(CASES))
def test_residual_norm_is_one_kernel(case, gpu):
    kind, b_shape, again = CASES[case]
    d = b_shape[-1]
    feeds = {"a": rng.standard_normal((2, 5, d)).astype(np.float32),
             "b": rng.standard_normal(b_shape).astype(np.float32)}
    inits = {"scale": rng.random(d).astype(np.float32) + 0.5}
    if kind == "layernorm17":
        inits["bias"] = rng.standard_normal(d).astype(np.float32)
    nodes = [helper.make_node("Add", ["a", "b"], ["s"])] + _norm_nodes(kind, "s", "n")
    last = helper.make_node("Mul", ["s", "n"], ["y"]) if again is True else helper.make_node("Relu", ["n"], ["y"])
    nodes.append(last)
    model = model_of(nodes, feeds, ["y", "s"] if again == "output" else ["y"], inits)
    net = dlnet.Net(gpu_like() if gpu else context()).load_onnx(model)
    got, want = net.run(feeds), reference(model, feeds)
    assert rel_l2(got["y"], want[0]) <= 1e-5
    if again == "output":
        assert rel_l2(got["s"], want[1]) <= 1e-6
    fused = [n for n in net.graph.nodes if n.op == "AddLayerNorm"]
    assert len(fused) == 1 and fused[0].attrs["rms"] == (kind == "rmsnorm23")
    assert len(fused[0].outputs) == 1 + bool(again) and fused[0].inputs[1].shape == b_shape
    assert [launch.label.split()[-1] for launch in net.launches][0] == "AddLayerNorm"
    net.release()


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("d", [768, 64, 200, 2048, 2056, 45])
def test_residual_norm_rows_of_a_warp(d, precision):
    """Rows of transformer widths, their count no multiple of a work-group's 4: on NVIDIA add_layernorm_warp takes
    rows of a multiple of 8 elements up to 2048 (a warp per row, its chunks in registers; the IR's tile "warp/4"),
    add_layernorm_wg the others. Against float64, with the sum read again (s * LayerNorm(s)); in fp16 a and b come
    from half products of the graph."""
    feeds = {"x": rng.standard_normal((3, 37, d)).astype(np.float32),
             "z": rng.standard_normal((3, 37, d)).astype(np.float32)}
    inits = {"scale": rng.random(d).astype(np.float32) + 0.5, "bias": rng.standard_normal(d).astype(np.float32),
             "h": np.float32(0.5), "t": np.float32(2.0)}
    nodes = [helper.make_node("Mul", ["x", "h"], ["a"]), helper.make_node("Mul", ["z", "t"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["s"])] + \
        [helper.make_node("LayerNormalization", ["s", "scale", "bias"], ["n"], epsilon=1e-3),
         helper.make_node("Mul", ["s", "n"], ["y"])]
    model = model_of(nodes, feeds, ["y"], inits)
    base = context()
    ctx = base if precision == "fp32" else dlnet.Context(base.info, precision="fp16", options=base.options)
    net = dlnet.Net(ctx).load_onnx(model)
    got = net.run(feeds)["y"]
    s = 0.5 * feeds["x"].astype(np.float64) + 2.0 * feeds["z"]
    n = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + 1e-3) * inits["scale"] + inits["bias"]
    assert rel_l2(got, s * n) <= (1e-5 if precision == "fp32" else 3e-3)
    fused = [x for x in net.graph.nodes if x.op == "AddLayerNorm"]
    assert len(fused) == 1 and len(fused[0].outputs) == 2
    warp = ctx.dev.is_nvidia and d % 8 == 0 and d <= 2048
    assert (fused[0].schedule.get("tile") == "warp/4") == warp, fused[0].schedule
    net.release()


def test_bias_free_projection_keeps_the_residual_as_its_c():
    """x @ w + r, then LayerNorm: the Gemm takes the residual Add as its C (it writes the sum; the norm reads it),
    which moves less than writing x @ w for an AddLayerNorm to read back (passes/transformer.py)."""
    feeds = {"x": rng.standard_normal((2, 5, 32)).astype(np.float32),
             "r": rng.standard_normal((2, 5, 32)).astype(np.float32)}
    inits = {"w": rng.standard_normal((32, 32)).astype(np.float32) * 0.2,
             "scale": rng.random(32).astype(np.float32) + 0.5, "bias": rng.standard_normal(32).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "scale", "bias"], ["n"], epsilon=1e-5),
             helper.make_node("Add", ["s", "n"], ["y"])]
    model = model_of(nodes, feeds, ["y"], inits, opset=17)
    net = dlnet.Net(context()).load_onnx(model)
    assert rel_l2(net.run(feeds)["y"], reference(model, feeds)[0]) <= 1e-5
    ops = [n.op for n in net.graph.nodes]
    gemm = next(n for n in net.graph.nodes if n.op == "Gemm")
    assert "AddLayerNorm" not in ops and "LayerNorm" in ops and len(gemm.inputs) == 3
    net.release()


def _qkv_model(extra_reader, gemm=False):
    """Q, K, V projections of x (+ bias) split into heads, attention, merged; extra_reader: K's projection is a graph
    output too (it cannot be a strided view: the group stays unfused); gemm: x is [B * T, D] and each projection an
    ONNX Gemm with beta 0.5 (its bias scaled so in the packed one)."""
    B, T, H, Dh = 2, 6, 2, 8
    D = H * Dh
    inits = {f"w{c}": rng.standard_normal((D, D)).astype(np.float32) * 0.3 for c in "qkv"}
    inits.update({f"b{c}": rng.standard_normal(D).astype(np.float32) * 0.1 for c in "qkv"})
    inits["heads"] = np.array([B, T, H, Dh], np.int64)
    inits["merged"] = np.array([B, T, D], np.int64)
    inits["scale"] = np.array(1 / np.sqrt(Dh), np.float32)
    nodes = []
    for c in "qkv":
        if gemm:
            nodes.append(helper.make_node("Gemm", ["x", f"w{c}", f"b{c}"], [f"p{c}"], beta=0.5))
        else:
            nodes += [helper.make_node("MatMul", ["x", f"w{c}"], [f"m{c}"]),
                      helper.make_node("Add", [f"m{c}", f"b{c}"], [f"p{c}"])]
        nodes += [
                  helper.make_node("Reshape", [f"p{c}", "heads"], [f"r{c}"]),
                  helper.make_node("Transpose", [f"r{c}"], [f"h{c}"], perm=[0, 2, 3, 1] if c == "k" else [0, 2, 1, 3])]
    nodes += [helper.make_node("MatMul", ["hq", "hk"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["z"]),
              helper.make_node("Softmax", ["z"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "hv"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merged"], ["y"])]
    feeds = {"x": rng.standard_normal((B * T, D) if gemm else (B, T, D)).astype(np.float32)}
    return make_model(nodes, feeds, ["y", "pk"] if extra_reader else ["y"], inits), feeds, D


@pytest.mark.parametrize("gpu", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("extra_reader,gemm", [(False, False), (True, False), (False, True)])
def test_qkv_projections_are_one_product_read_in_place(extra_reader, gemm, gpu):
    model, feeds, D = _qkv_model(extra_reader, gemm)
    net = dlnet.Net(gpu_like() if gpu else context()).load_onnx(model)
    got, want = net.run(feeds), reference(model, feeds)
    assert rel_l2(got["y"], want[0]) <= 1e-5
    # (the output columns of each product's weight: stored [N, K] where a GPU's gemv reads it)
    gemms = [n.inputs[1].shape[0 if n.attrs["transB"] else 1] for n in net.graph.nodes if n.op == "Gemm"]
    views = [n for n in net.graph.nodes if n.op == "ColumnView"]
    if extra_reader:
        assert rel_l2(got["pk"], want[1]) <= 1e-5
        # k is read whole by the graph's output: q and v pack together, k alone
        assert sorted(gemms) == [D, 2 * D] and len(views) == 2
    else:
        assert gemms == [3 * D] and len(views) == 3
    assert "Copy" not in str(net.graph) and not any(n.op == "Transpose" for n in net.graph.nodes)
    net.release()


def test_view_strides():
    assert view_strides((2, 5, 4, 8), 32, 96) == [480, 96, 8, 1]  # [B, T, H, D] of a [B * T, 3 * H * D] product
    assert view_strides((10, 32), 32, 96) == [96, 1]
    assert view_strides((2, 5, 4, 8), 16, 96) is None  # 16 columns split the heads axis
    assert view_strides((2, 3), 6, 6) == [3, 1]  # contiguous



class PackedBlock(nn.Module):
    """nn.MultiheadAttention's one in-projection [D, 3D] (torchvision's ViT; Swin's qkv alike), split by the exporter
    as Reshape, Transpose and a Gather per projection."""

    def __init__(self, batch_first):
        super().__init__()
        self.ln = nn.LayerNorm(tt.D)
        self.attn = nn.MultiheadAttention(tt.D, tt.HEADS, batch_first=batch_first)

    def forward(self, x):
        y = self.ln(x)
        return x + self.attn(y, y, y, need_weights=False)[0]


@pytest.mark.parametrize("gpu", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("batch_first", [True, False])
def test_packed_in_projection_is_read_in_place(batch_first, gpu):
    torch.manual_seed(0)
    module = PackedBlock(batch_first).eval()
    x = torch.randn(3, 7, tt.D)
    buf = io.BytesIO()  # (op-set 17: nn.MultiheadAttention's scaled_dot_product_attention needs 14)
    torch.onnx.export(module, (x,), buf, opset_version=17, dynamo=False, input_names=["x"], output_names=["y"])
    data = buf.getvalue()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    net = dlnet.Net(gpu_like() if gpu else context()).load_onnx(onnx.load_from_string(data))
    feeds = {"x": rng.standard_normal((3, 7, tt.D)).astype(np.float32)}
    assert rel_l2(net.run(feeds)["y"], sess.run(None, feeds)[0]) <= 1e-5
    ops = [n.op for n in net.graph.nodes]
    views = [n for n in net.graph.nodes if n.op == "ColumnView"]
    # (batch_first's own Transposes, in and out, go: the rows between are worked on in the input's order, and the
    # attention reads and writes them through its layouts: passes/transposes.py rows_in_input_order)
    fused = [m.op for n in net.graph.nodes if n.op == "Fused" for m in n.attrs["nodes"]]
    assert "Gather" not in ops and "Transpose" not in ops + fused
    assert sorted(v.attrs["start"] for v in views) == [0, tt.D, 2 * tt.D] and ops.count("Gemm") == 2
    net.release()


@pytest.mark.parametrize("split", ["columns", "rows"])
def test_packed_split_is_a_view_only_where_it_takes_columns(split):
    """P [6, 48] split as Reshape [6, 3, 16] -> Transpose -> Gather: each part is 16 columns of every row (a column
    view); as Reshape [2, 3, 48] -> Transpose -> Gather: rows 0 and 3 (not columns: no column view; the Gather stays
    a copy, or a SliceView where the rows it takes are contiguous and aligned: layout.slices_as_views)."""
    inits = {"w": rng.standard_normal((16, 48)).astype(np.float32) * 0.3,
             "i": np.array(1 if split == "columns" else 0, np.int64),
             "split": np.array([6, 3, 16] if split == "columns" else [2, 3, 48], np.int64),
             "heads": np.array([1, 6, 2, 8], np.int64), "scale": np.array(0.3, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Reshape", ["p", "split"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Gather", ["t", "i"], ["g"], axis=0), helper.make_node("Reshape", ["g", "heads"], ["h"]),
             helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["h", "ht"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["z"]),
             helper.make_node("Softmax", ["z"], ["a"], axis=-1), helper.make_node("MatMul", ["a", "h"], ["y"])]
    feeds = {"x": rng.standard_normal((6, 16)).astype(np.float32)}
    model = make_model(nodes, feeds, ["y"], inits)
    net = dlnet.Net(context()).load_onnx(model)
    assert rel_l2(net.run(feeds)["y"], reference(model, feeds)[0]) <= 1e-5
    ops = [n.op for n in net.graph.nodes]
    assert ops.count("Attention") == 1 and ("ColumnView" in ops) == (split == "columns") and \
        ("Gather" in ops or "SliceView" in ops) == (split == "rows")
    net.release()


class Gpt2Attention(nn.Module):
    """Hugging Face GPT-2's c_attn: one Linear to [q | k | v], Split along the last axis (Slices in the IR)."""

    def __init__(self):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(tt.D, 3 * tt.D), nn.Linear(tt.D, tt.D)

    def forward(self, x):
        b, t, _ = x.shape
        heads = [y.view(b, t, tt.HEADS, tt.D // tt.HEADS).permute(0, 2, 1, 3) for y in self.c_attn(x).split(tt.D, 2)]
        q, k, v = heads
        w = torch.softmax(q @ k.transpose(-1, -2) / (tt.D // tt.HEADS) ** 0.5, -1)
        return self.c_proj((w @ v).permute(0, 2, 1, 3).reshape(b, t, tt.D)) + x


@pytest.mark.parametrize("gpu", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_split_packed_projection_is_read_in_place(gpu):
    torch.manual_seed(0)
    data = tt._export(Gpt2Attention(), torch.randn(2, 7, tt.D), {0: "batch", 1: "seq"})
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    net = dlnet.Net(gpu_like() if gpu else context()).load_onnx(onnx.load_from_string(data))
    feeds = {"x": rng.standard_normal((3, 5, tt.D)).astype(np.float32)}
    assert rel_l2(net.run(feeds)["y"], sess.run(None, feeds)[0]) <= 1e-5
    ops = [n.op for n in net.graph.nodes]
    views = [n for n in net.graph.nodes if n.op == "ColumnView"]
    assert "Slice" not in ops and "Transpose" not in ops and ops.count("Gemm") == 2
    assert sorted(v.attrs["start"] for v in views) == [0, tt.D, 2 * tt.D]
    net.release()
